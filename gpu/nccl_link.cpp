// p2p_link over nccl_comm: no NCCL call of its own, so it builds
// everywhere; built without NCCL, nccl_comm::start throws and so does
// nccl_link().
#include "gpu/nccl_link.hpp"

#include "gpu/ipc_memory.hpp"
#include "gpu/kernels.hpp"
#include "gpu/nccl_comm.hpp"

#include <mutex>
#include <stdexcept>
#include <string>

namespace rlsync::gpu {

void check_p2p(const comm_layout& layout, int rank, int peer, std::size_t n, std::size_t capacity,
               const char* what) {
  if (peer < 0 || peer >= layout.size() || peer == rank)
    throw gpu_error(std::string(what) + ": peer " + std::to_string(peer) + " is not another member of epoch "
                    + std::to_string(layout.epoch) + "'s " + std::to_string(layout.size()) + " ranks");
  check_range(0, n, capacity, what);
}

void check_broadcast(const comm_layout& layout, int rank, int root, const std::uint8_t* host, std::size_t n,
                     std::size_t capacity) {
  if (root < 0 || root >= layout.size())
    throw gpu_error("nccl broadcast: root " + std::to_string(root) + " is no member of epoch "
                    + std::to_string(layout.epoch) + "'s " + std::to_string(layout.size()) + " ranks");
  if (root == rank && host == nullptr)
    throw gpu_error("nccl broadcast: the root passes no bytes");
  check_range(0, n, capacity, "nccl broadcast");
}

namespace {

// Every method takes the link's lock and its device: a membership aborts a
// link from one thread while a sender or puller polls it from another, and
// nccl_comm itself is not thread-safe.
class nccl_p2p_link final : public p2p_link {
public:
  nccl_p2p_link(std::unique_ptr<nccl_comm> comm, comm_layout layout, int rank, int device, device_buffer staging)
    : comm_(std::move(comm)), layout_(std::move(layout)), rank_(rank), device_(device), staging_(std::move(staging)) {}
  ~nccl_p2p_link() override {
    device_guard on(device_, std::nothrow); // freed on their device where it can be made current
    comm_.reset();
    staging_ = device_buffer();
  }

  // poll and abort never throw: they run in wait loops, aborts and destructors.
  comm_poll poll(std::string& why) override {
    std::lock_guard<std::mutex> lock(mutex_);
    device_guard on(device_, std::nothrow);
    if (!on.ok()) {
      why = "cannot make device " + std::to_string(device_) + " current";
      return comm_poll::failed;
    }
    return comm_->poll(why);
  }
  void abort() override {
    std::lock_guard<std::mutex> lock(mutex_);
    device_guard on(device_, std::nothrow);
    comm_->abort(); // whatever the device: ncclCommAbort frees what it can
  }
  const comm_layout& layout() const override { return layout_; }
  int rank() const override { return rank_; }
  std::size_t capacity() const override { return staging_.size(); }

  void send(const std::uint8_t* host, std::size_t n, int peer) override {
    send_filled([&](void* staging) { copy(staging, host, n, copy_kind::host_to_device); }, n, peer);
  }
  void send_filled(const std::function<void(void*)>& fill, std::size_t n, int peer) override {
    check_p2p(layout_, rank_, peer, n, capacity(), "nccl send");
    std::lock_guard<std::mutex> lock(mutex_);
    device_guard on(device_);
    // The previous operation polled done, so nothing reads the staging now;
    // the copy or the kernels finished when `fill` returns (kernels.hpp).
    fill(staging_.data());
    comm_->enqueue_p2p({{true, peer, staging_.data(), n}});
  }
  void recv(std::size_t n, int peer) override {
    check_p2p(layout_, rank_, peer, n, capacity(), "nccl receive");
    std::lock_guard<std::mutex> lock(mutex_);
    device_guard on(device_);
    comm_->enqueue_p2p({{false, peer, staging_.data(), n}});
  }
  void broadcast(const std::uint8_t* host, std::size_t n, int root) override {
    check_broadcast(layout_, rank_, root, host, n, capacity());
    if (root == rank_)
      return broadcast_filled([&](void* staging) { copy(staging, host, n, copy_kind::host_to_device); }, n);
    std::lock_guard<std::mutex> lock(mutex_);
    device_guard on(device_);
    comm_->enqueue_broadcast(staging_.data(), n, root);
  }
  void broadcast_filled(const std::function<void(void*)>& fill, std::size_t n) override {
    check_range(0, n, capacity(), "nccl broadcast");
    std::lock_guard<std::mutex> lock(mutex_);
    device_guard on(device_);
    fill(staging_.data()); // finished when it returns, as send_filled's
    comm_->enqueue_broadcast(staging_.data(), n, rank_);
  }
  void read(std::uint8_t* host, std::size_t n) override {
    use_received([&](const void* staging, int) { copy(host, staging, n, copy_kind::device_to_host); }, n);
  }
  void use_received(const std::function<void(const void*, int)>& use, std::size_t n) override {
    check_range(0, n, capacity(), "nccl read");
    std::lock_guard<std::mutex> lock(mutex_);
    device_guard on(device_);
    use(staging_.data(), device_);
  }

private:
  std::mutex mutex_;
  std::unique_ptr<nccl_comm> comm_;
  comm_layout layout_;
  int rank_;
  int device_;
  device_buffer staging_;
};

} // namespace

std::unique_ptr<p2p_link> nccl_link(const nccl_id& id, comm_layout layout, int rank, int device, std::size_t capacity) {
  if (rank < 0 || rank >= layout.size())
    throw std::invalid_argument("nccl: rank " + std::to_string(rank) + " outside epoch "
                                + std::to_string(layout.epoch) + "'s " + std::to_string(layout.size()) + " members");
  device_guard on(device); // the caller's thread (an actor's) keeps its own device
  auto comm = nccl_comm::start(id, rank, layout.size(), device);
  device_buffer staging(capacity == 0 ? 1 : capacity);
  return std::make_unique<nccl_p2p_link>(std::move(comm), std::move(layout), rank, device, std::move(staging));
}

} // namespace rlsync::gpu
