#pragma once
// NCCL's point-to-point and broadcast semantics in host memory, so that
// the nccl backend runs end to end on the CPU: a send completes once its
// peer posted the matching receive (and the other way round), in the order
// each pair posted them; a broadcast completes once every member of the
// communicator posted its own (the k-th of each member's broadcasts
// match); a member that never posts holds the others up until their
// deadlines, as on a real communicator; a size or root mismatch fails every
// side as NCCL's errors do. Thread-safe: members run on threads of their
// own.
#include "gpu/ipc_memory.hpp"
#include "gpu/nccl_link.hpp"

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace rlsync::test {

class fake_nccl_world {
  struct op {
    bool send = true;
    std::size_t n = 0;
    std::vector<std::uint8_t> bytes; ///< what a send carries; where a receive lands
    bool done = false;
    std::string failed; ///< non-empty: NCCL's error
  };
  using pair_key = std::pair<int, int>; // (from, to)

public:
  class link final : public gpu::p2p_link {
  public:
    link(std::shared_ptr<fake_nccl_world> world, gpu::comm_layout layout, int rank, std::size_t capacity,
         int device = 0)
      : world_(std::move(world)), layout_(std::move(layout)), rank_(rank), capacity_(capacity), device_(device) {}
    ~link() override { abort(); }

    gpu::comm_poll poll(std::string& why) override {
      std::lock_guard<std::mutex> lock(world_->mutex_);
      if (aborted_) {
        why = "the communicator was aborted";
        return gpu::comm_poll::failed;
      }
      if (!last_ || last_->done)
        return gpu::comm_poll::done;
      if (!last_->failed.empty()) {
        why = last_->failed;
        return gpu::comm_poll::failed;
      }
      return gpu::comm_poll::in_progress;
    }
    void abort() override {
      std::lock_guard<std::mutex> lock(world_->mutex_);
      if (aborted_)
        return;
      aborted_ = true;
      ++world_->aborted_[{layout_.epoch, rank_}];
      world_->forget(last_);
    }
    const gpu::comm_layout& layout() const override { return layout_; }
    int rank() const override { return rank_; }
    std::size_t capacity() const override { return capacity_; }

    void send(const std::uint8_t* host, std::size_t n, int peer) override {
      send_filled([&](void* staging) { std::copy(host, host + n, static_cast<std::uint8_t*>(staging)); }, n, peer);
    }
    void send_filled(const std::function<void(void*)>& fill, std::size_t n, int peer) override {
      gpu::check_p2p(layout_, rank_, peer, n, capacity_, "nccl send");
      std::vector<std::uint8_t> staging(n); // host memory plays the device's (host_pack_device)
      fill(staging.data());
      auto o = begin(true, n);
      o->bytes = std::move(staging);
      world_->post(rank_, peer, o);
    }
    void recv(std::size_t n, int peer) override {
      gpu::check_p2p(layout_, rank_, peer, n, capacity_, "nccl receive");
      world_->post(peer, rank_, begin(false, n));
    }
    void broadcast(const std::uint8_t* host, std::size_t n, int root) override {
      gpu::check_broadcast(layout_, rank_, root, host, n, capacity_);
      if (root == rank_)
        return broadcast_filled(
          [&](void* staging) { std::copy(host, host + n, static_cast<std::uint8_t*>(staging)); }, n);
      world_->join_broadcast(layout_, rank_, root, broadcasts_++, begin(false, n));
    }
    void broadcast_filled(const std::function<void(void*)>& fill, std::size_t n) override {
      gpu::check_range(0, n, capacity_, "nccl broadcast");
      std::vector<std::uint8_t> staging(n); // host memory plays the device's (host_pack_device)
      fill(staging.data());
      auto o = begin(true, n);
      o->bytes = std::move(staging);
      world_->join_broadcast(layout_, rank_, rank_, broadcasts_++, o);
    }
    void read(std::uint8_t* host, std::size_t n) override {
      use_received([&](const void* staging, int) { std::memcpy(host, staging, n); }, n);
    }
    /// The received bytes where the world keeps them, as the link's device's.
    void use_received(const std::function<void(const void*, int)>& use, std::size_t n) override {
      std::lock_guard<std::mutex> lock(world_->mutex_);
      if (!last_ || last_->send || !last_->done)
        throw gpu::gpu_error("nccl read before a receive finished");
      if (n > last_->bytes.size())
        throw std::out_of_range("nccl read past the received bytes");
      use(last_->bytes.data(), device_);
    }

  private:
    std::shared_ptr<op> begin(bool send, std::size_t n) {
      std::lock_guard<std::mutex> lock(world_->mutex_);
      if (aborted_)
        throw gpu::gpu_error("nccl operation on an aborted communicator");
      if (last_ && !last_->done && last_->failed.empty())
        throw gpu::gpu_error("nccl operation before the last one finished");
      last_ = std::make_shared<op>();
      last_->send = send;
      last_->n = n;
      return last_;
    }

    std::shared_ptr<fake_nccl_world> world_;
    gpu::comm_layout layout_;
    int rank_;
    std::size_t capacity_;
    int device_; ///< what use_received says the staging is on
    bool aborted_ = false;
    std::shared_ptr<op> last_;
    std::uint64_t broadcasts_ = 0; ///< posted so far: the next one's place in the sequence
  };

  static std::shared_ptr<fake_nccl_world> make() { return std::shared_ptr<fake_nccl_world>(new fake_nccl_world); }

  /// `device`: the CUDA device the member's staging stands for.
  static std::unique_ptr<link> join(const std::shared_ptr<fake_nccl_world>& world, gpu::comm_layout layout, int rank,
                                    std::size_t capacity, int device = 0) {
    return std::make_unique<link>(world, std::move(layout), rank, capacity, device);
  }

  /// How many links of (epoch, rank) were aborted, whether or not they
  /// still exist.
  int aborted(std::uint64_t epoch, int rank) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = aborted_.find({epoch, rank});
    return it == aborted_.end() ? 0 : it->second;
  }

  /// Sends posted and not yet matched (a receiver that never came).
  std::size_t unmatched() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::size_t n = 0;
    for (auto& [key, q] : sends_)
      n += q.size();
    for (auto& [key, q] : recvs_)
      n += q.size();
    return n;
  }

  /// Broadcasts some member posted that not every member has yet.
  std::size_t open_broadcasts() {
    std::lock_guard<std::mutex> lock(mutex_);
    return broadcasts_.size();
  }

private:
  fake_nccl_world() = default;

  // One collective: the members' ops as they post, and what they agreed on.
  struct collective {
    std::map<int, std::shared_ptr<op>> ops; // by rank
    std::map<int, int> roots;               // the root each rank named
  };

  // Adds rank's `o` to broadcast number `seq` of the communicator; once
  // every member posted, it completes (or fails, for all) at once.
  void join_broadcast(const gpu::comm_layout& layout, int rank, int root, std::uint64_t seq,
                      const std::shared_ptr<op>& o) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& c = broadcasts_[{layout.epoch, seq}];
    c.ops[rank] = o;
    c.roots[rank] = root;
    if (c.ops.size() < static_cast<std::size_t>(layout.size()))
      return;
    std::string failed;
    for (const auto& [r, x] : c.ops)
      if (x->n != o->n || c.roots[r] != root)
        failed = "invalid usage: broadcast " + std::to_string(seq) + " of epoch " + std::to_string(layout.epoch)
                 + ": members disagree on its size or root";
    const auto from = c.ops.find(root);
    for (auto& [r, x] : c.ops) {
      if (!failed.empty()) {
        x->failed = failed;
        continue;
      }
      if (r != root)
        x->bytes = from->second->bytes;
      x->done = true;
    }
    broadcasts_.erase({layout.epoch, seq});
  }

  // Under mutex_: match `o` (from -> to) with the other side's oldest, or queue it.
  void post(int from, int to, const std::shared_ptr<op>& o) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& mine = o->send ? sends_[{from, to}] : recvs_[{from, to}];
    auto& theirs = o->send ? recvs_[{from, to}] : sends_[{from, to}];
    if (theirs.empty()) {
      mine.push_back(o);
      return;
    }
    auto other = theirs.front();
    theirs.pop_front();
    auto& s = o->send ? *o : *other;
    auto& r = o->send ? *other : *o;
    if (s.n != r.n) {
      s.failed = r.failed = "invalid usage: message truncated (sent " + std::to_string(s.n) + " bytes, receiving "
                            + std::to_string(r.n) + ")";
      return;
    }
    r.bytes = s.bytes;
    s.done = r.done = true;
  }
  void forget(const std::shared_ptr<op>& o) {
    if (!o)
      return;
    for (auto* m : {&sends_, &recvs_})
      for (auto& [key, q] : *m)
        for (auto it = q.begin(); it != q.end();)
          it = *it == o ? q.erase(it) : std::next(it);
    // An aborted member never completes its broadcast: neither does anyone's.
    for (auto& [key, c] : broadcasts_)
      for (auto it = c.ops.begin(); it != c.ops.end();)
        it = it->second == o ? c.ops.erase(it) : std::next(it);
  }

  std::mutex mutex_;
  std::map<pair_key, std::deque<std::shared_ptr<op>>> sends_, recvs_;
  std::map<std::pair<std::uint64_t, int>, int> aborted_;
  std::map<std::pair<std::uint64_t, std::uint64_t>, collective> broadcasts_; // (epoch, seq)
};

} // namespace rlsync::test
