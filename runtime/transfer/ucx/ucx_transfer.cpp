#include "runtime/transfer/ucx/ucx_transfer.hpp"

#include "runtime/base/checksum.hpp"
#include "runtime/plan/groups.hpp"
#include "runtime/transfer/packing.hpp"
#include "runtime/transfer/ucx/ucx_wire.hpp"

#include <ucp/api/ucp.h>
#include <uct/api/uct.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <utility>

namespace rlsync::transfer {

namespace wire = ucx_wire;

namespace {

// Active message ids: requests go to the producer, replies to the consumer.
constexpr unsigned am_request = 17;
constexpr unsigned am_reply = 18;

std::string hex(std::uint64_t x) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(x));
  return buf;
}

std::string who(const pull_request& r) {
  return "engine '" + r.engine + "' worker " + std::to_string(r.worker);
}

void say(const ucx_log& log, const std::string& line) {
  if (log)
    log(line);
}

std::chrono::milliseconds ms_until(clock::time_point t, clock::time_point now = clock::now()) {
  return std::chrono::ceil<std::chrono::milliseconds>(std::max(t - now, clock::duration::zero()));
}

// -- buffers ------------------------------------------------------------------------------

// Page-aligned memory, touched once when allocated (platform notes: copying
// into fresh pages runs at a tenth of the speed of copying into touched
// ones), huge pages where the kernel gives them. Reused for the life of a
// producer or a consumer connection.
class host_buffer {
public:
  host_buffer() = default;
  explicit host_buffer(std::size_t size) {
    if (size == 0)
      return;
    constexpr std::size_t huge = std::size_t(2) << 20;
    const std::size_t align = size >= huge ? huge : 4096;
    const std::size_t rounded = (size + align - 1) / align * align;
    void* p = nullptr;
    if (posix_memalign(&p, align, rounded) != 0)
      throw std::bad_alloc();
    if (align == huge)
      madvise(p, rounded, MADV_HUGEPAGE); // advisory: ignore failure
    std::memset(p, 0, rounded);
    data_.reset(static_cast<std::uint8_t*>(p));
    capacity_ = rounded;
  }
  std::uint8_t* data() const { return data_.get(); }
  std::size_t capacity() const { return capacity_; }

private:
  struct freer {
    void operator()(std::uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<std::uint8_t, freer> data_;
  std::size_t capacity_ = 0;
};

// -- transports ---------------------------------------------------------------------------

std::optional<ucx_transport> kind_of_tl(const std::string& tl) {
  if (tl == "posix" || tl == "sysv" || tl == "xpmem" || tl == "mm")
    return ucx_transport::shm;
  if (tl == "cma" || tl == "knem")
    return ucx_transport::cma;
  if (tl == "tcp")
    return ucx_transport::tcp;
  auto starts = [&](const char* p) { return tl.rfind(p, 0) == 0; };
  if (starts("rc") || starts("ud") || starts("dc") || tl == "ib")
    return ucx_transport::rdma;
  return std::nullopt; // self, and anything unknown
}

struct tl_resource {
  std::string tl;
  std::string dev;
};

// The transports UCT offers on this machine (no UCP context needed).
std::vector<tl_resource> query_resources() {
  std::vector<tl_resource> out;
  uct_component_h* comps = nullptr;
  unsigned ncomps = 0;
  if (uct_query_components(&comps, &ncomps) != UCS_OK)
    return out;
  for (unsigned i = 0; i < ncomps; ++i) {
    uct_component_attr_t attr{};
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME | UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
    if (uct_component_query(comps[i], &attr) != UCS_OK || attr.md_resource_count == 0)
      continue;
    std::vector<uct_md_resource_desc_t> mds(attr.md_resource_count);
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
    attr.md_resources = mds.data();
    if (uct_component_query(comps[i], &attr) != UCS_OK)
      continue;
    for (const auto& mdr : mds) {
      uct_md_config_t* config = nullptr;
      if (uct_md_config_read(comps[i], nullptr, nullptr, &config) != UCS_OK)
        continue;
      uct_md_h md = nullptr;
      const ucs_status_t st = uct_md_open(comps[i], mdr.md_name, config, &md);
      uct_config_release(config);
      if (st != UCS_OK)
        continue;
      uct_tl_resource_desc_t* tls = nullptr;
      unsigned ntls = 0;
      if (uct_md_query_tl_resources(md, &tls, &ntls) == UCS_OK) {
        for (unsigned t = 0; t < ntls; ++t)
          out.push_back({tls[t].tl_name, tls[t].dev_name});
        uct_release_tl_resource_list(tls);
      }
      uct_md_close(md);
    }
  }
  uct_release_component_list(comps);
  return out;
}

bool device_selected(const std::string& dev, const std::string& net_devices) {
  if (net_devices.empty() || net_devices == "all")
    return true;
  std::stringstream ss(net_devices);
  std::string d;
  while (std::getline(ss, d, ','))
    if (d == dev || dev.rfind(d + ":", 0) == 0 || d.rfind(dev + ":", 0) == 0)
      return true;
  return false;
}

const std::vector<ucx_transport>& all_kinds() {
  static const std::vector<ucx_transport> k{ucx_transport::shm, ucx_transport::cma, ucx_transport::tcp,
                                            ucx_transport::rdma};
  return k;
}

// kind -> tl -> devices (network devices filtered by net_devices).
using catalog = std::map<ucx_transport, std::map<std::string, std::set<std::string>>>;

catalog make_catalog(const std::string& net_devices) {
  catalog c;
  for (const auto& r : query_resources()) {
    auto k = kind_of_tl(r.tl);
    if (!k)
      continue;
    const bool network = *k == ucx_transport::tcp || *k == ucx_transport::rdma;
    if (network && !device_selected(r.dev, net_devices))
      continue;
    c[*k][r.tl].insert(r.dev);
  }
  return c;
}

std::string describe(const catalog& c) {
  std::string out;
  for (auto k : all_kinds()) {
    auto it = c.find(k);
    if (it == c.end())
      continue;
    std::string detail;
    for (const auto& [tl, devs] : it->second) {
      const bool network = k == ucx_transport::tcp || k == ucx_transport::rdma;
      if (network) {
        for (const auto& d : devs)
          detail += (detail.empty() ? "" : ", ") + (k == ucx_transport::tcp ? d : tl + "/" + d);
      } else if (std::string(to_string(k)) != tl) {
        detail += (detail.empty() ? "" : ", ") + tl;
      }
    }
    out += (out.empty() ? "" : ", ") + std::string(to_string(k)) + (detail.empty() ? "" : " (" + detail + ")");
  }
  return out.empty() ? "none" : out;
}

std::string list(const std::vector<ucx_transport>& ts) {
  std::string out;
  for (auto t : ts)
    out += (out.empty() ? "" : ", ") + std::string(to_string(t));
  return "[" + out + "]";
}

// UCX_TLS for a topology's transport list; throws ucx_error naming what is
// missing. tcp is always added when present: UCX's client/server connection
// establishment needs it even when shm and cma will carry every byte
// (measured: UCX_TLS=posix,cma alone gives "Destination is unreachable" on
// connect). The lane check on each endpoint keeps it from carrying data
// unless the list names it.
std::string tls_for(const std::vector<ucx_transport>& named, const catalog& c, const std::string& role) {
  std::string tls;
  std::set<std::string> added;
  auto add = [&](const std::string& tl) {
    if (added.insert(tl).second)
      tls += (tls.empty() ? "" : ",") + tl;
  };
  for (auto k : named) {
    auto it = c.find(k);
    if (it == c.end() || it->second.empty())
      throw ucx_error("ucx " + role + ": transfer.ucx_transports " + list(named) + " names "
                      + std::string(to_string(k)) + ", but UCX offers no " + std::string(to_string(k))
                      + " transport on this machine (available: " + describe(c)
                      + "); refusing to fall back to a slower one");
    for (const auto& [tl, devs] : it->second)
      add(tl);
  }
  if (auto it = c.find(ucx_transport::tcp); it != c.end())
    for (const auto& [tl, devs] : it->second)
      add(tl);
  return tls;
}

struct ucx_context {
  ucp_context_h handle = nullptr;
  std::string tls; // what UCX_TLS was set to ("" = UCX's default)
  ~ucx_context() {
    if (handle)
      ucp_cleanup(handle);
  }
};

std::unique_ptr<ucx_context> make_context(const std::vector<ucx_transport>& named, const std::string& net_devices,
                                          const std::string& role, bool fixed_port = false) {
  if (fixed_port) {
    // A producer restarted on its configured port must not wait out
    // TIME_WAIT (platform notes). The tcp connection manager takes this
    // from the environment only (ucp_config_modify rejects it as an
    // "invalid configuration"). Set once, before the first such context,
    // and never over a value the user chose; ephemeral ports need nothing.
    static std::once_flag reuseaddr;
    std::call_once(reuseaddr, [] { setenv("UCX_TCP_CM_REUSEADDR", "y", 0); });
  }
  auto ctx = std::make_unique<ucx_context>();
  if (!named.empty())
    ctx->tls = tls_for(named, make_catalog(net_devices), role);
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK)
    throw ucx_error("ucx " + role + ": cannot read the UCX configuration: " + ucs_status_string(st));
  auto modify = [&](const char* name, const std::string& value) {
    if (const ucs_status_t s = ucp_config_modify(config, name, value.c_str()); s != UCS_OK) {
      ucp_config_release(config);
      throw ucx_error("ucx " + role + ": cannot set UCX_" + name + "=" + value + ": " + ucs_status_string(s));
    }
  };
  if (!ctx->tls.empty())
    modify("TLS", ctx->tls);
  if (!net_devices.empty())
    modify("NET_DEVICES", net_devices);
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  // WAKEUP: idle waits sleep on the worker's event fd instead of spinning;
  // on a 2-core VM a spinning consumer starves the producer's packing.
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 1; // a puller creates workers from several pulling threads
  st = ucp_init(&params, config, &ctx->handle);
  ucp_config_release(config);
  if (st != UCS_OK) {
    ctx->handle = nullptr;
    throw ucx_error("ucx " + role + ": cannot initialise UCX"
                    + (ctx->tls.empty() ? std::string() : " with UCX_TLS=" + ctx->tls) + ": "
                    + ucs_status_string(st));
  }
  return ctx;
}

struct worker_handle {
  ucp_worker_h handle = nullptr;
  int efd = -1;
};

worker_handle make_worker(ucp_context_h ctx, const std::string& role) {
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // One thread at a time: a consumer connection is reused by whichever
  // thread pulls next; the producer's worker is its progress thread's.
  params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  worker_handle w;
  ucs_status_t st = ucp_worker_create(ctx, &params, &w.handle);
  if (st != UCS_OK)
    throw ucx_error("ucx " + role + ": cannot create a UCX worker: " + ucs_status_string(st));
  st = ucp_worker_get_efd(w.handle, &w.efd);
  if (st != UCS_OK) {
    ucp_worker_destroy(w.handle);
    throw ucx_error("ucx " + role + ": the UCX worker has no event fd: " + ucs_status_string(st));
  }
  return w;
}

// What one endpoint's lanes use, parsed from ucp_ep_print_info (UCX 1.13
// has no query for it):
//   lane[1]:  2:sysv/memory.0 md[2]  -> md[2]/sysv/sysdev[255] am am_bw#0
struct lane_info {
  std::string text;                // "sysv/memory.0 am am_bw#0, cma/memory.0 rma_bw#0"
  std::set<ucx_transport> kinds;   // of lanes that carry data
  std::vector<std::string> data_tls;
  std::string summary() const {
    std::string s;
    for (auto k : all_kinds())
      if (kinds.count(k))
        s += (s.empty() ? "" : "/") + std::string(to_string(k));
    return s.empty() ? "none" : s;
  }
};

lane_info ep_lanes(ucp_ep_h ep) {
  lane_info out;
  char* buf = nullptr;
  std::size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  if (!f)
    return out;
  ucp_ep_print_info(ep, f);
  std::fclose(f);
  std::istringstream in(std::string(buf, len));
  std::free(buf);
  std::string line;
  while (std::getline(in, line)) {
    const auto at = line.find("lane[");
    if (at == std::string::npos)
      continue;
    const auto colon = line.find("]:", at);
    if (colon == std::string::npos)
      continue;
    std::istringstream toks(line.substr(colon + 2));
    std::string rsc;
    toks >> rsc;
    if (rsc == "cm" || rsc.empty())
      continue; // the connection manager's lane carries no data
    const auto c = rsc.find(':'), s = rsc.find('/');
    if (c == std::string::npos || s == std::string::npos || s < c)
      continue;
    const std::string tl = rsc.substr(c + 1, s - c - 1);
    const std::string dev = rsc.substr(c + 1);
    std::string tok, usage;
    bool past_arrow = false, skipped_remote = false, data = false;
    while (toks >> tok) {
      if (!past_arrow) {
        past_arrow = tok == "->";
        continue;
      }
      if (!skipped_remote) {
        skipped_remote = true; // the remote md/tl descriptor
        continue;
      }
      usage += " " + tok;
      if (tok != "wireup" && tok != "keepalive")
        data = true;
    }
    out.text += (out.text.empty() ? "" : ", ") + dev + usage;
    if (!data)
      continue;
    out.data_tls.push_back(tl);
    if (auto k = kind_of_tl(tl))
      out.kinds.insert(*k);
  }
  return out;
}

// Empty when every data lane uses a named transport (or none was named).
std::string lanes_refused(const lane_info& l, const std::vector<ucx_transport>& named) {
  if (named.empty())
    return {};
  std::string bad;
  for (const auto& tl : l.data_tls) {
    auto k = kind_of_tl(tl);
    if (k && std::find(named.begin(), named.end(), *k) != named.end())
      continue;
    bad += (bad.empty() ? "" : ", ") + tl;
  }
  if (bad.empty())
    return {};
  return "the connection would move bytes over " + bad + " (lanes: " + l.text + "), which transfer.ucx_transports "
         + list(named) + " does not name";
}

// -- waiting ------------------------------------------------------------------------------

// Drives worker `w` until `done()` holds or `until` passes (false). Spins
// while there is progress and briefly after, then sleeps on the worker's
// event fd so that an idle wait costs no CPU; sleeps are capped at `nap` so
// that the deadline and other threads' requests are seen in time even if an
// event is missed.
template <class Done>
bool drive(const worker_handle& w, clock::time_point until, Done done,
           std::chrono::milliseconds nap = std::chrono::milliseconds(5)) {
  int idle = 0;
  for (;;) {
    if (done())
      return true;
    if (ucp_worker_progress(w.handle) != 0) {
      idle = 0;
      continue;
    }
    if (done())
      return true;
    const auto now = clock::now();
    if (now >= until)
      return false;
    if (++idle < 200)
      continue; // replies usually come within microseconds
    idle = 0;
    const ucs_status_t st = ucp_worker_arm(w.handle);
    if (st == UCS_ERR_BUSY)
      continue; // events pending: progress them
    const auto wait = std::clamp(ms_until(until, now), std::chrono::milliseconds(1), nap);
    pollfd p{w.efd, POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(wait.count()));
  }
}

// -- active messages ----------------------------------------------------------------------

// Receives whole control messages on a worker: eager ones are copied in the
// callback (their data lives only during it); rendezvous ones (large plans
// or manifests) are fetched into a buffer of their announced size, which
// must not exceed `limit`.
struct am_inbox {
  struct incoming {
    std::vector<std::uint8_t> bytes;
    ucp_ep_h reply_ep = nullptr;
    std::size_t too_big = 0; // announced size when over the limit (bytes empty)
  };
  struct fetching {
    void* request = nullptr;
    incoming msg;
  };

  ucp_worker_h worker = nullptr;
  std::size_t limit = 0;
  std::deque<incoming> ready;
  std::list<fetching> pending;

  static ucs_status_t on_message(void* arg, const void* /*header*/, size_t /*header_length*/, void* data,
                                 size_t length, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<am_inbox*>(arg);
    incoming in;
    if (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)
      in.reply_ep = param->reply_ep;
    const bool rndv = param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV;
    if (length > self->limit) {
      in.too_big = length;
      if (rndv)
        ucp_am_data_release(self->worker, data);
      self->ready.push_back(std::move(in));
      return UCS_OK;
    }
    if (!rndv) {
      const auto* p = static_cast<const std::uint8_t*>(data);
      in.bytes.assign(p, p + length);
      self->ready.push_back(std::move(in));
      return UCS_OK;
    }
    auto& f = self->pending.emplace_back();
    f.msg = std::move(in);
    f.msg.bytes.resize(length);
    ucp_request_param_t rp{};
    rp.op_attr_mask = 0; // completion is polled (am_inbox::poll)
    void* req = ucp_am_recv_data_nbx(self->worker, data, f.msg.bytes.data(), length, &rp);
    if (UCS_PTR_IS_ERR(req)) {
      self->pending.pop_back(); // lost: the sender's wait will time out
    } else if (req == nullptr) {
      self->ready.push_back(std::move(f.msg));
      self->pending.pop_back();
    } else {
      f.request = req;
    }
    return UCS_OK;
  }

  void install(ucp_worker_h w, unsigned id, std::size_t max_bytes) {
    worker = w;
    limit = max_bytes;
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG
                    | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    hp.id = id;
    hp.cb = &am_inbox::on_message;
    hp.arg = this;
    hp.flags = UCP_AM_FLAG_WHOLE_MSG;
    if (const ucs_status_t st = ucp_worker_set_am_recv_handler(w, &hp); st != UCS_OK)
      throw ucx_error(std::string("ucx: cannot install the message handler: ") + ucs_status_string(st));
  }

  // Moves finished rendezvous receptions to `ready`.
  void poll() {
    for (auto it = pending.begin(); it != pending.end();) {
      const ucs_status_t st = ucp_request_check_status(it->request);
      if (st == UCS_INPROGRESS) {
        ++it;
        continue;
      }
      ucp_request_free(it->request);
      if (st == UCS_OK)
        ready.push_back(std::move(it->msg));
      it = pending.erase(it);
    }
  }

  void cancel_all() {
    for (auto& f : pending) {
      ucp_request_cancel(worker, f.request);
      ucp_request_free(f.request); // released by UCX once it completes
    }
    pending.clear();
  }
};

// Control messages being sent; each owns its bytes until UCX is done with them.
struct am_outbox {
  struct sending {
    void* request = nullptr;
    ucp_ep_h ep = nullptr;
    std::vector<std::uint8_t> bytes;
  };
  std::list<sending> inflight;

  // False when UCX refused the send outright.
  bool send(ucp_ep_h ep, unsigned id, std::vector<std::uint8_t> bytes, bool reply) {
    auto& s = inflight.emplace_back();
    s.ep = ep;
    s.bytes = std::move(bytes);
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    rp.flags = reply ? UCP_AM_SEND_FLAG_REPLY : 0;
    void* req = ucp_am_send_nbx(ep, id, nullptr, 0, s.bytes.data(), s.bytes.size(), &rp);
    if (req == nullptr || UCS_PTR_IS_ERR(req)) {
      inflight.pop_back();
      return req == nullptr;
    }
    s.request = req;
    return true;
  }
  void poll() {
    for (auto it = inflight.begin(); it != inflight.end();) {
      if (ucp_request_check_status(it->request) == UCS_INPROGRESS) {
        ++it;
        continue;
      }
      ucp_request_free(it->request);
      it = inflight.erase(it);
    }
  }
  bool pending_on(ucp_ep_h ep) const {
    return std::any_of(inflight.begin(), inflight.end(), [&](const sending& s) { return s.ep == ep; });
  }
  // Only once the worker is about to be destroyed: the bytes must outlive
  // any send UCX still holds.
  void abandon(std::vector<std::vector<std::uint8_t>>& keep) {
    for (auto& s : inflight) {
      ucp_request_free(s.request);
      keep.push_back(std::move(s.bytes));
    }
    inflight.clear();
  }
};

// Why endpoints are closed with care. UCX 1.13 aborts the process ("Bug:
// pending request ... on ep ... should have been flushed") when a worker is
// destroyed while one of its endpoints still queues a send, such as a hello
// waiting for a connection that failed, and it cannot force-close an
// endpoint without peer error handling (which these endpoints do not use).
// So an endpoint with sends outstanding is closed gracefully (UCX completes
// its queued sends, logging flush errors when the peer is gone) before its
// worker goes; one without is left to the worker, and a worker whose close
// does not complete is not destroyed.

// Starts closing `ep` gracefully and progresses `w` for at most `grace`.
// Returns the close request if it is still running (nullptr when done).
void* close_ep(const worker_handle& w, ucp_ep_h ep, std::chrono::milliseconds grace) {
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  rp.flags = 0;
  void* req = ucp_ep_close_nbx(ep, &rp);
  if (req == nullptr || UCS_PTR_IS_ERR(req))
    return nullptr;
  drive(w, clock::now() + grace, [&] { return ucp_request_check_status(req) != UCS_INPROGRESS; },
        std::chrono::milliseconds(1));
  if (ucp_request_check_status(req) != UCS_INPROGRESS) {
    ucp_request_free(req);
    return nullptr;
  }
  return req;
}

// -- addresses ----------------------------------------------------------------------------

struct host_port {
  std::string host;
  std::string port;
};

host_port split_address(const std::string& address) {
  host_port hp;
  if (!address.empty() && address.front() == '[') {
    const auto close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() || address[close + 1] != ':')
      throw std::invalid_argument("ucx: malformed address '" + address + "' (expected [v6]:port)");
    hp.host = address.substr(1, close - 1);
    hp.port = address.substr(close + 2);
  } else {
    const auto colon = address.rfind(':');
    if (colon == std::string::npos || colon == 0)
      throw std::invalid_argument("ucx: malformed address '" + address + "' (expected host:port)");
    hp.host = address.substr(0, colon);
    hp.port = address.substr(colon + 1);
  }
  if (hp.port.empty() || hp.port.size() > 5 || !std::all_of(hp.port.begin(), hp.port.end(), ::isdigit)
      || std::stoul(hp.port) == 0 || std::stoul(hp.port) > 65535)
    throw std::invalid_argument("ucx: malformed port in address '" + address + "'");
  return hp;
}

// Throws std::runtime_error when the name does not resolve.
sockaddr_storage resolve(const host_port& hp, socklen_t& len, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(hp.host.empty() ? nullptr : hp.host.c_str(), hp.port.c_str(), &hints, &res);
  if (rc != 0 || !res)
    throw std::runtime_error("cannot resolve '" + hp.host + "': " + gai_strerror(rc));
  sockaddr_storage ss{};
  std::memcpy(&ss, res->ai_addr, res->ai_addrlen);
  len = res->ai_addrlen;
  freeaddrinfo(res);
  return ss;
}

std::string sockaddr_string(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = "?";
  std::uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    port = ntohs(a->sin_port);
    return std::string(host) + ":" + std::to_string(port);
  }
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    port = ntohs(a->sin6_port);
    return "[" + std::string(host) + "]:" + std::to_string(port);
  }
  return "?";
}

transfer_failure failure_of(wire::status s) {
  switch (s) {
    case wire::status::version_unavailable: return transfer_failure::version_unavailable;
    case wire::status::not_registered: return transfer_failure::not_registered;
    case wire::status::shutting_down: return transfer_failure::cancelled;
    default: return transfer_failure::producer_failed;
  }
}

} // namespace

// -- availability -------------------------------------------------------------------------

bool ucx_available(std::string* why) {
  static std::once_flag once;
  static bool ok = false;
  static std::string reason;
  std::call_once(once, [] {
    ucp_config_t* config = nullptr;
    ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
    if (st != UCS_OK) {
      reason = std::string("cannot read the UCX configuration: ") + ucs_status_string(st);
      return;
    }
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_TAG | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    ucp_context_h ctx = nullptr;
    st = ucp_init(&params, config, &ctx);
    ucp_config_release(config);
    if (st != UCS_OK) {
      reason = std::string("cannot create a UCX context: ") + ucs_status_string(st);
      return;
    }
    ucp_cleanup(ctx);
    ok = true;
  });
  if (why)
    *why = reason;
  return ok;
}

std::string ucx_transports_here() {
  return describe(make_catalog(""));
}

// =========================================================================================
// Producer
// =========================================================================================

namespace {

struct cache_key {
  bool broadcast = false;
  std::uint64_t plan = 0; // digest; 0 for broadcast
  std::uint64_t version = 0;
  std::uint32_t group = 0;
  bool operator<(const cache_key& o) const {
    return std::tie(broadcast, plan, version, group) < std::tie(o.broadcast, o.plan, o.version, o.group);
  }
};

struct session {
  std::uint64_t id = 0;
  std::string engine;
  int worker = 0;
  int tp = 1;
  std::uint64_t version = 0;
  transfer_mode mode = transfer_mode::sharded;
  std::uint64_t digest = 0;
  snapshot_ptr snapshot; // the version stays intact while it is pulled
  std::shared_ptr<const plan::grouped_plan> plan;
  std::set<std::uint32_t> groups;
  clock::time_point last_used;
};

struct connection {
  std::uint64_t id = 0;
  ucp_ep_h ep = nullptr;
  std::string peer;
  bool failed = false;
  std::string failure;
  bool closed = false;
  bool lanes_checked = false;
  std::string refused; // non-empty: the lanes use a transport not allowed
  std::map<std::uint64_t, std::shared_ptr<const plan::grouped_plan>> plans;
  std::deque<std::uint64_t> plan_order;
  std::map<std::uint64_t, session> sessions;
  std::uint64_t next_session = 1;
  std::size_t outstanding = 0; // gets accepted and not finished
  clock::time_point last_active;
};
using conn_ptr = std::shared_ptr<connection>;

constexpr std::size_t max_plans_per_connection = 256;
constexpr std::size_t max_sessions_per_connection = 64;

struct get_job {
  conn_ptr conn;
  std::uint64_t seq = 0;
  std::uint32_t group = 0;
  std::uint64_t tag = 0;
  clock::time_point deadline;
  std::string engine;
  int worker = 0;
  std::uint64_t version = 0;
  // What packing the group takes, should it have to be packed.
  cache_key key;
  snapshot_ptr snapshot;
  std::shared_ptr<const plan::grouped_plan> plan;
};

struct cache_entry {
  cache_key key;
  enum class state { packing, ready, failed } st = state::packing;
  host_buffer buffer;
  std::size_t size = 0;
  std::uint64_t checksum = 0;
  std::string error;
  std::size_t refs = 0; // waiters and sends in flight: not evictable while > 0
  std::vector<get_job> waiters;
  std::uint64_t last_use = 0;
};
using entry_ptr = std::shared_ptr<cache_entry>;

struct pack_job {
  cache_key key;
  snapshot_ptr snapshot;
  std::shared_ptr<const plan::grouped_plan> plan; // sharded
  host_buffer buffer;                       // reused if large enough
};

struct pack_result {
  cache_key key;
  host_buffer buffer;
  std::size_t size = 0;
  std::uint64_t checksum = 0;
  std::string error;
};

struct send_op {
  void* request = nullptr;
  entry_ptr entry;
  conn_ptr conn;
  clock::time_point deadline;
  std::vector<std::uint8_t> altered; // a corrupted private copy (fault hook)
  std::uint64_t bytes = 0;
  std::uint32_t group = 0;
  bool abandoned = false; // past its deadline; kept until UCX lets go of the buffer
};

} // namespace

struct ucx_producer::impl {
  std::shared_ptr<const weight_source> source;
  ucx_producer_options options;
  std::unique_ptr<ucx_context> ctx;
  worker_handle worker;
  ucp_listener_h listener = nullptr;
  std::uint16_t bound_port = 0;
  std::string bound_address;
  am_inbox inbox;
  am_outbox outbox;

  // Progress thread only.
  std::map<ucp_ep_h, conn_ptr> conns;
  std::vector<std::pair<ucp_ep_h, std::string>> errors; // from the error callback
  std::map<cache_key, entry_ptr> cache;
  std::deque<get_job> blocked; // waiting for a free cache slot
  std::vector<host_buffer> spare;
  std::list<send_op> sends;
  std::uint64_t use_clock = 0;
  std::uint64_t next_conn = 1;
  std::vector<std::vector<std::uint8_t>> graveyard; // bytes UCX may still read at teardown
  bool retry_blocked = false;                       // a cache slot may have freed
  std::list<void*> closes;                          // endpoint closes in progress
  bool leak_worker = false;                         // see shutdown()

  // Packers.
  std::mutex pack_mutex;
  std::condition_variable pack_cv;
  std::deque<pack_job> pack_queue;
  std::deque<pack_result> pack_done;
  std::vector<std::thread> packers;

  std::atomic<bool> stopping{false};
  std::thread progress;

  mutable std::mutex stats_mutex;
  ucx_producer_stats st;

  fault_hooks faults;

  std::map<std::string, tensor_spec> params_by_name;
  std::vector<std::uint64_t> full_group_bytes; // per model group, from the source's parameters

  // -- setup --------------------------------------------------------------------------

  void start() {
    // The model's full group sizes bound what a plan may make us pack.
    const auto& c = source->config();
    full_group_bytes.assign(plan::group_count(c), 0);
    for (const auto& p : source->parameters()) {
      params_by_name[p.name] = p;
      full_group_bytes[plan::group_of(c, p.name)] += p.bytes();
    }

    ctx = make_context(options.transports, options.net_devices, "producer", options.port != 0);
    worker = make_worker(ctx->handle, "producer");
    inbox.install(worker.handle, am_request, options.max_message_bytes);

    socklen_t len = 0;
    sockaddr_storage addr{};
    try {
      addr = resolve({options.listen_address, std::to_string(options.port)}, len, true);
    } catch (const std::exception& e) {
      throw ucx_error("ucx producer: listen address '" + options.listen_address + "': " + e.what());
    }
    ucp_listener_params_t lp{};
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
    lp.sockaddr.addrlen = len;
    lp.conn_handler.cb = &impl::on_connection;
    lp.conn_handler.arg = this;
    ucs_status_t s = ucp_listener_create(worker.handle, &lp, &listener);
    if (s != UCS_OK)
      throw ucx_error("ucx producer: cannot listen on " + options.listen_address + ":"
                      + std::to_string(options.port) + ": " + ucs_status_string(s));
    ucp_listener_attr_t la{};
    la.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    s = ucp_listener_query(listener, &la);
    if (s != UCS_OK)
      throw ucx_error(std::string("ucx producer: cannot query the listener: ") + ucs_status_string(s));
    bound_port = la.sockaddr.ss_family == AF_INET6
                     ? ntohs(reinterpret_cast<const sockaddr_in6*>(&la.sockaddr)->sin6_port)
                     : ntohs(reinterpret_cast<const sockaddr_in*>(&la.sockaddr)->sin_port);
    const bool any = options.listen_address == "0.0.0.0" || options.listen_address == "::"
                     || options.listen_address.empty();
    const std::string host = any ? "127.0.0.1" : options.listen_address;
    bound_address =
        (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(bound_port);

    say(options.log, "ucx producer: listening on " + sockaddr_string(la.sockaddr) + " (UCX_TLS="
                         + (ctx->tls.empty() ? std::string("UCX default") : ctx->tls) + ")");
    for (unsigned i = 0; i < std::max(1u, options.pack_threads); ++i)
      packers.emplace_back([this] { pack_loop(); });
    progress = std::thread([this] { run(); });
  }

  void stop() {
    stopping = true;
    if (worker.handle)
      ucp_worker_signal(worker.handle);
    if (progress.joinable())
      progress.join(); // its shutdown() released the listener and the connections
    if (listener) {    // start() failed before the progress thread ran
      ucp_listener_destroy(listener);
      listener = nullptr;
    }
    {
      std::lock_guard<std::mutex> lock(pack_mutex);
      pack_queue.clear();
    }
    pack_cv.notify_all();
    for (auto& t : packers)
      t.join();
    packers.clear();
    if (leak_worker) {
      // Destroying the worker would make UCX abort the process: leak it,
      // the context and every buffer it may still read, on purpose.
      (void)ctx.release();
      worker.handle = nullptr;
      auto* keep = new std::vector<entry_ptr>();
      for (auto& [k, e] : cache)
        keep->push_back(e);
      for (auto& o : sends) {
        keep->push_back(o.entry);
        if (!o.altered.empty())
          (void)new std::vector<std::uint8_t>(std::move(o.altered));
      }
      (void)new std::vector<std::vector<std::uint8_t>>(std::move(graveyard));
      cache.clear();
      sends.clear();
      return;
    }
    if (worker.handle) {
      // Whatever UCX still holds is released with the worker; the buffers
      // it points into (cache entries, graveyard) outlive it.
      ucp_worker_destroy(worker.handle);
      worker.handle = nullptr;
    }
    cache.clear();
    sends.clear();
    graveyard.clear();
    ctx.reset();
  }

  // -- UCX callbacks (called from ucp_worker_progress, on the progress thread) ---------

  static void on_connection(ucp_conn_request_h request, void* arg) {
    auto* self = static_cast<impl*>(arg);
    std::string peer = "?";
    ucp_conn_request_attr_t attr{};
    attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
    if (ucp_conn_request_query(request, &attr) == UCS_OK)
      peer = sockaddr_string(attr.client_address);
    if (self->stopping) {
      ucp_listener_reject(self->listener, request);
      return;
    }
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLER
                    | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.conn_request = request;
    ep.err_mode = UCP_ERR_HANDLING_MODE_NONE; // PEER would restrict UCX to tcp lanes
    ep.err_handler.cb = &impl::on_ep_error;
    ep.err_handler.arg = self;
    ucp_ep_h handle = nullptr;
    const ucs_status_t st = ucp_ep_create(self->worker.handle, &ep, &handle);
    if (st != UCS_OK) {
      say(self->options.log, "ucx producer: cannot accept a connection from " + peer + ": " + ucs_status_string(st));
      return;
    }
    auto c = std::make_shared<connection>();
    c->id = self->next_conn++;
    c->ep = handle;
    c->peer = peer;
    c->last_active = clock::now();
    self->conns[handle] = c;
    {
      std::lock_guard<std::mutex> lock(self->stats_mutex);
      ++self->st.connections;
    }
    say(self->options.log, "ucx producer: accepted a connection from " + peer);
  }

  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status) {
    static_cast<impl*>(arg)->errors.emplace_back(ep, ucs_status_string(status));
  }

  // -- the progress thread ------------------------------------------------------------

  void run() {
    auto last_sweep = clock::now();
    while (!stopping) {
      unsigned n = 0;
      for (unsigned k; (k = ucp_worker_progress(worker.handle)) != 0 && n < 1024;)
        n += k;
      inbox.poll();
      outbox.poll();
      poll_closes();
      n += handle_errors();
      n += handle_messages();
      n += handle_packed();
      n += poll_sends();
      const auto now = clock::now();
      if (now - last_sweep >= std::chrono::milliseconds(5)) {
        sweep(now);
        last_sweep = now;
      }
      if (n != 0)
        continue;
      // Idle: sleep on the event fd; packers and stop() wake us with ucp_worker_signal.
      if (ucp_worker_arm(worker.handle) == UCS_ERR_BUSY)
        continue;
      pollfd p{worker.efd, POLLIN, 0};
      ::poll(&p, 1, 10);
    }
    shutdown();
  }

  void shutdown() {
    if (listener) {
      ucp_listener_destroy(listener);
      listener = nullptr;
    }
    // Idle endpoints are not closed one by one (a graceful close needs each
    // consumer to progress, and an idle one does not): destroying the worker
    // (stop()) releases them, and consumers see the connection reset (their
    // pulls fail with `cancelled`). Endpoints with sends outstanding must be
    // closed first (see close_ep); if that does not complete, the worker is
    // leaked rather than destroyed.
    outbox.poll();
    for (auto& [ep, c] : conns) {
      const bool busy = outbox.pending_on(ep) || std::any_of(sends.begin(), sends.end(), [&](const send_op& o) {
                          return o.conn == c && ucp_request_check_status(o.request) == UCS_INPROGRESS;
                        });
      c->closed = true;
      if (busy)
        start_close(ep);
    }
    conns.clear();
    drive(worker, clock::now() + std::chrono::milliseconds(500), [&] {
      poll_closes();
      return closes.empty();
    }, std::chrono::milliseconds(1));
    if (!closes.empty()) {
      say(options.log, "ucx producer: " + std::to_string(closes.size())
                           + " connection(s) did not close; the UCX worker is leaked rather than destroyed");
      leak_worker = true;
    }
    for (auto& s : sends)
      ucp_request_free(s.request); // the buffers stay alive until the worker is gone
    inbox.cancel_all();
    outbox.abandon(graveyard);
  }

  void start_close(ucp_ep_h ep) {
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    rp.flags = 0;
    void* req = ucp_ep_close_nbx(ep, &rp);
    if (req != nullptr && !UCS_PTR_IS_ERR(req))
      closes.push_back(req);
  }

  void poll_closes() {
    for (auto it = closes.begin(); it != closes.end();) {
      if (ucp_request_check_status(*it) == UCS_INPROGRESS) {
        ++it;
        continue;
      }
      ucp_request_free(*it);
      it = closes.erase(it);
    }
  }

  unsigned handle_errors() {
    if (errors.empty())
      return 0;
    auto errs = std::move(errors);
    errors.clear();
    for (auto& [ep, why] : errs) {
      auto it = conns.find(ep);
      if (it == conns.end())
        continue;
      it->second->failed = true;
      it->second->failure = why;
      close_connection(it->second, "connection failed: " + why);
    }
    return static_cast<unsigned>(errs.size());
  }

  // Drops everything a connection holds and closes its endpoint. Sends in
  // flight complete (with an error) once UCX gives up the endpoint.
  void close_connection(const conn_ptr& c, const std::string& why, bool loud = true) {
    if (c->closed)
      return;
    c->closed = true;
    if (loud)
      say(options.log, "ucx producer: closing the connection from " + c->peer + ": " + why);
    for (auto& [key, e] : cache) {
      const auto before = e->waiters.size();
      e->waiters.erase(std::remove_if(e->waiters.begin(), e->waiters.end(),
                                      [&](const get_job& j) { return j.conn == c; }),
                       e->waiters.end());
      e->refs -= before - e->waiters.size();
      if (e->refs == 0)
        retry_blocked = true;
    }
    blocked.erase(std::remove_if(blocked.begin(), blocked.end(), [&](const get_job& j) { return j.conn == c; }),
                  blocked.end());
    c->sessions.clear();
    c->plans.clear();
    c->plan_order.clear();
    conns.erase(c->ep);
    start_close(c->ep); // completes in the background (poll_closes)
  }

  void reply(const conn_ptr& c, const wire::message& m) {
    if (c->closed)
      return;
    if (!outbox.send(c->ep, am_reply, wire::encode(m), false))
      say(options.log, "ucx producer: cannot answer " + c->peer);
  }

  void count_rejected() {
    std::lock_guard<std::mutex> lock(stats_mutex);
    ++st.rejected;
  }

  unsigned handle_messages() {
    unsigned n = 0;
    while (!inbox.ready.empty()) {
      auto in = std::move(inbox.ready.front());
      inbox.ready.pop_front();
      ++n;
      {
        std::lock_guard<std::mutex> lock(stats_mutex);
        ++st.requests;
      }
      auto it = conns.find(in.reply_ep);
      if (it == conns.end()) {
        say(options.log, "ucx producer: dropped a message from an unknown endpoint");
        continue;
      }
      const conn_ptr c = it->second;
      c->last_active = clock::now();
      check_lanes(*c);
      if (in.too_big) {
        count_rejected();
        say(options.log, "ucx producer: rejected a message of " + std::to_string(in.too_big) + " bytes from "
                             + c->peer + " (limit " + std::to_string(options.max_message_bytes) + ")");
        reply(c, wire::reject_msg{0, wire::status::bad_request,
                                  "message of " + std::to_string(in.too_big) + " bytes exceeds the limit of "
                                      + std::to_string(options.max_message_bytes)});
        continue;
      }
      wire::message m;
      try {
        m = wire::decode(in.bytes.data(), in.bytes.size());
      } catch (const wire::wire_error& e) {
        count_rejected();
        say(options.log, "ucx producer: rejected a malformed message from " + c->peer + ": " + e.what());
        reply(c, wire::reject_msg{wire::peek_seq(in.bytes.data(), in.bytes.size()), wire::status::bad_request,
                                  std::string("malformed message: ") + e.what()});
        continue;
      }
      if (!c->refused.empty()) {
        count_rejected();
        reply(c, wire::reject_msg{std::visit([](const auto& x) { return seq_of(x); }, m), wire::status::not_allowed,
                                  "producer: " + c->refused});
        continue;
      }
      std::visit([&](auto& x) { handle(c, x); }, m);
    }
    return n;
  }

  template <class T>
  static std::uint64_t seq_of(const T& x) {
    return x.seq;
  }

  void check_lanes(connection& c) {
    if (c.lanes_checked)
      return;
    c.lanes_checked = true;
    const lane_info l = ep_lanes(c.ep);
    c.refused = lanes_refused(l, options.transports);
    say(options.log, "ucx producer: connection from " + c.peer + " uses " + l.text + " [" + l.summary() + "]"
                         + (c.refused.empty() ? "" : "; refused: " + c.refused));
  }

  // -- requests -----------------------------------------------------------------------

  void handle(const conn_ptr& c, const wire::hello_msg& m) { reply(c, wire::ack_msg{m.seq, wire::status::ok, 0, ""}); }

  void handle(const conn_ptr& c, const wire::plan_msg& m) {
    auto refuse = [&](wire::status s, const std::string& why) {
      count_rejected();
      say(options.log, "ucx producer: rejected a plan from " + c->peer + ": " + why);
      reply(c, wire::ack_msg{m.seq, s, 0, why});
    };
    const std::uint64_t digest = checksum64(m.plan.data(), m.plan.size());
    if (c->plans.count(digest)) {
      reply(c, wire::ack_msg{m.seq, wire::status::ok, digest, ""});
      return;
    }
    std::shared_ptr<const plan::grouped_plan> grouped;
    try {
      auto p = std::make_shared<const plan::worker_plan>(wire::decode_plan(m.plan.data(), m.plan.size()));
      check_against_model(*p);
      grouped = std::make_shared<const plan::grouped_plan>(source->config(), std::move(p));
    } catch (const wire::wire_error& e) {
      refuse(wire::status::bad_request, std::string("malformed plan: ") + e.what());
      return;
    } catch (const std::exception& e) {
      refuse(wire::status::producer_failed, std::string("the plan does not fit this producer's model: ") + e.what());
      return;
    }
    for (std::uint32_t g = 0; g < grouped->group_count(); ++g)
      if (grouped->bytes(g) > 4 * std::max<std::uint64_t>(full_group_bytes[g], 1)) {
        refuse(wire::status::producer_failed,
               "the plan packs " + std::to_string(grouped->bytes(g)) + " bytes for group " + std::to_string(g)
                   + ", more than 4x the group's " + std::to_string(full_group_bytes[g]));
        return;
      }
    if (c->plans.size() >= max_plans_per_connection) {
      c->plans.erase(c->plan_order.front());
      c->plan_order.pop_front();
    }
    c->plans[digest] = std::move(grouped);
    c->plan_order.push_back(digest);
    reply(c, wire::ack_msg{m.seq, wire::status::ok, digest, ""});
  }

  // Entries for tensors this producer holds must match them in dtype and
  // shape (entries for tensors it does not hold are another rank's).
  void check_against_model(const plan::worker_plan& p) const {
    for (std::size_t i = 0; i < p.entries.size(); ++i) {
      const auto& e = p.entries[i];
      auto it = params_by_name.find(e.source);
      if (it == params_by_name.end())
        continue;
      if (it->second.type != e.source_type || it->second.shape != e.source_shape)
        throw std::invalid_argument("plan entry " + std::to_string(i) + ": tensor '" + e.source + "' is "
                                    + std::string(safetensors_name(it->second.type)) + " "
                                    + shape_string(it->second.shape) + ", the plan was recorded for "
                                    + std::string(safetensors_name(e.source_type)) + " "
                                    + shape_string(e.source_shape));
    }
  }

  void handle(const conn_ptr& c, const wire::open_msg& m) {
    wire::manifest_msg out;
    out.seq = m.seq;
    auto refuse = [&](wire::status s, const std::string& why) {
      out.status = s;
      out.error = why;
      reply(c, out);
    };
    const bool broadcast = m.mode == transfer_mode::broadcast;
    std::shared_ptr<const plan::grouped_plan> plan;
    if (!broadcast) {
      auto it = c->plans.find(m.plan);
      if (it == c->plans.end()) {
        refuse(wire::status::not_registered, "plan " + hex(m.plan) + " is not registered on this connection");
        return;
      }
      plan = it->second;
      if (plan->tp() != m.tp || plan->worker() != m.worker) {
        count_rejected();
        refuse(wire::status::bad_request, "plan " + hex(m.plan) + " is worker " + std::to_string(plan->worker())
                                              + " of tp " + std::to_string(plan->tp()) + ", the request names worker "
                                              + std::to_string(m.worker) + " of tp " + std::to_string(m.tp));
        return;
      }
    }
    auto snapshot = source->find(m.version);
    if (!snapshot) {
      std::string held;
      for (auto v : source->versions())
        held += (held.empty() ? "" : ", ") + std::to_string(v);
      refuse(wire::status::version_unavailable, "version " + std::to_string(m.version) + " is not held (held: "
                                                    + (held.empty() ? "none" : held) + ")");
      return;
    }
    session s;
    s.id = c->next_session++;
    s.engine = m.engine;
    s.worker = m.worker;
    s.tp = m.tp;
    s.version = m.version;
    s.mode = m.mode;
    s.digest = broadcast ? 0 : m.plan;
    s.snapshot = snapshot;
    s.plan = plan;
    s.last_used = clock::now();
    for (auto g : snapshot->groups()) {
      wire::group_info gi;
      gi.group = g;
      if (broadcast) {
        const auto layout = plan::full_group_layout::of(snapshot->group(g));
        gi.bytes = layout.bytes;
        gi.tensors = layout.specs;
      } else {
        gi.bytes = plan->bytes(g);
      }
      out.groups.push_back(std::move(gi));
      s.groups.insert(g);
    }
    if (c->sessions.size() >= max_sessions_per_connection) {
      auto oldest = std::min_element(c->sessions.begin(), c->sessions.end(), [](const auto& a, const auto& b) {
        return a.second.last_used < b.second.last_used;
      });
      c->sessions.erase(oldest);
    }
    out.session = s.id;
    c->sessions[s.id] = std::move(s);
    reply(c, out);
  }

  void handle(const conn_ptr& c, const wire::close_msg& m) { c->sessions.erase(m.session); }

  // The consumer is going: close from this side first, while the endpoint
  // is healthy. (Were the consumer to close first, this side would see a
  // failed endpoint, and closing that makes UCX log flush errors.)
  void handle(const conn_ptr& c, const wire::bye_msg&) { close_connection(c, "the consumer said goodbye", false); }

  void handle(const conn_ptr& c, const wire::get_msg& m) {
    auto refuse = [&](wire::status s, const std::string& why) {
      count_rejected();
      reply(c, wire::group_msg{m.seq, s, why, m.group, 0, 0});
    };
    auto sit = c->sessions.find(m.session);
    if (sit == c->sessions.end()) {
      refuse(wire::status::not_registered, "session " + std::to_string(m.session) + " is not open on this connection");
      return;
    }
    session& s = sit->second;
    s.last_used = clock::now();
    if (!s.groups.count(m.group)) {
      refuse(wire::status::bad_request, "group " + std::to_string(m.group) + " is not part of version "
                                            + std::to_string(s.version) + " here");
      return;
    }
    if (c->outstanding >= options.max_outstanding_per_connection) {
      refuse(wire::status::busy, "more than " + std::to_string(options.max_outstanding_per_connection)
                                     + " requests outstanding on this connection");
      return;
    }
    if (faults.is_withheld(s.version, m.group)) {
      std::lock_guard<std::mutex> lock(stats_mutex);
      ++st.withheld;
      return; // the drill: never answered
    }
    get_job j;
    j.conn = c;
    j.seq = m.seq;
    j.group = m.group;
    j.tag = m.tag;
    j.deadline = clock::now() + std::min<std::chrono::milliseconds>(std::chrono::milliseconds(m.timeout_ms),
                                                                    options.max_send_time);
    j.engine = s.engine;
    j.worker = s.worker;
    j.version = s.version;
    j.key = cache_key{s.mode == transfer_mode::broadcast, s.digest, s.version, m.group};
    j.snapshot = s.snapshot;
    j.plan = s.plan;
    ++c->outstanding;
    start_get(std::move(j));
  }

  void handle(const conn_ptr& c, const wire::ack_msg& m) { unexpected(c, m.seq); }
  void handle(const conn_ptr& c, const wire::manifest_msg& m) { unexpected(c, m.seq); }
  void handle(const conn_ptr& c, const wire::group_msg& m) { unexpected(c, m.seq); }
  void handle(const conn_ptr& c, const wire::reject_msg& m) { unexpected(c, m.seq); }
  void unexpected(const conn_ptr& c, std::uint64_t seq) {
    count_rejected();
    reply(c, wire::reject_msg{seq, wire::status::bad_request, "a reply is not a request"});
  }

  // -- the packed-group cache ---------------------------------------------------------

  // Serves a get from the cache: sends a packed group, waits for one being
  // packed, or starts packing it in a free (or freed) slot; with every slot
  // busy sending, the get waits in `blocked` until one frees or its deadline.
  void start_get(get_job j) {
    auto it = cache.find(j.key);
    if (it == cache.end()) {
      if (cache.size() >= options.max_packed_groups && !evict_one()) {
        blocked.push_back(std::move(j));
        return;
      }
      auto e = std::make_shared<cache_entry>();
      e->key = j.key;
      it = cache.emplace(j.key, e).first;
      {
        std::lock_guard<std::mutex> lock(stats_mutex);
        st.peak_packed = std::max(st.peak_packed, cache.size());
      }
      pack_job pj;
      pj.key = j.key;
      pj.snapshot = j.snapshot;
      pj.plan = j.key.broadcast ? nullptr : j.plan;
      pj.buffer = take_spare();
      {
        std::lock_guard<std::mutex> lock(pack_mutex);
        pack_queue.push_back(std::move(pj));
      }
      pack_cv.notify_one();
    }
    const entry_ptr e = it->second;
    e->last_use = ++use_clock;
    ++e->refs;
    switch (e->st) {
      case cache_entry::state::packing: e->waiters.push_back(std::move(j)); break;
      case cache_entry::state::ready: send_group(std::move(j), e); break;
      case cache_entry::state::failed: fail_get(j, e); break;
    }
  }

  host_buffer take_spare() {
    if (spare.empty())
      return {};
    auto best = std::max_element(spare.begin(), spare.end(), [](const host_buffer& a, const host_buffer& b) {
      return a.capacity() < b.capacity();
    });
    host_buffer b = std::move(*best);
    spare.erase(best);
    return b;
  }

  // Frees the least recently used entry nobody waits for or sends from.
  bool evict_one() {
    auto victim = cache.end();
    for (auto it = cache.begin(); it != cache.end(); ++it)
      if (it->second->refs == 0 && it->second->st != cache_entry::state::packing
          && (victim == cache.end() || it->second->last_use < victim->second->last_use))
        victim = it;
    if (victim == cache.end())
      return false;
    if (victim->second->buffer.capacity() > 0 && spare.size() + cache.size() <= options.max_packed_groups)
      spare.push_back(std::move(victim->second->buffer));
    cache.erase(victim);
    return true;
  }

  void release(const entry_ptr& e) {
    if (--e->refs == 0)
      retry_blocked = true;
  }

  void finish_get(const get_job& j) {
    if (j.conn->outstanding > 0)
      --j.conn->outstanding;
  }

  void fail_get(const get_job& j, const entry_ptr& e) {
    reply(j.conn, wire::group_msg{j.seq, wire::status::producer_failed,
                                  "the producer failed to pack group " + std::to_string(j.group) + " of version "
                                      + std::to_string(j.version) + ": " + e->error,
                                  j.group, 0, 0});
    finish_get(j);
    release(e);
  }

  void send_group(get_job j, const entry_ptr& e) {
    if (j.conn->closed) {
      finish_get(j);
      release(e);
      return;
    }
    send_op op;
    op.entry = e;
    op.conn = j.conn;
    op.deadline = j.deadline;
    op.bytes = e->size;
    op.group = j.group;
    const std::uint8_t* data = e->buffer.data();
    if (take_corruption(j) && e->size > 0) {
      // The drill: this consumer receives altered bytes under the true checksum.
      op.altered.assign(data, data + e->size);
      op.altered[op.altered.size() / 2] ^= 0x5a;
      data = op.altered.data();
    }
    ucp_request_param_t rp{};
    rp.op_attr_mask = 0;
    void* req = ucp_tag_send_nbx(j.conn->ep, data, e->size, j.tag, &rp);
    if (UCS_PTR_IS_ERR(req)) {
      reply(j.conn, wire::group_msg{j.seq, wire::status::producer_failed,
                                    std::string("cannot send: ") + ucs_status_string(UCS_PTR_STATUS(req)), j.group,
                                    0, 0});
      finish_get(j);
      release(e);
      return;
    }
    reply(j.conn, wire::group_msg{j.seq, wire::status::ok, "", j.group, e->size, e->checksum});
    finish_get(j);
    if (req == nullptr) {
      count_sent(op.bytes);
      release(e);
      return;
    }
    op.request = req;
    sends.push_back(std::move(op));
  }

  void count_sent(std::uint64_t bytes) {
    std::lock_guard<std::mutex> lock(stats_mutex);
    ++st.groups_sent;
    st.bytes_sent += bytes;
  }

  unsigned poll_sends() {
    unsigned n = 0;
    const auto now = clock::now();
    for (auto it = sends.begin(); it != sends.end();) {
      const ucs_status_t s = ucp_request_check_status(it->request);
      if (s == UCS_INPROGRESS) {
        if (!it->abandoned && now >= it->deadline) {
          // The consumer has given up on this group (its deadline passed):
          // it is gone or partitioned. Close the connection; the entry
          // leaves the cache (its slot serves others) but its buffer stays
          // alive with this send until UCX lets go of it.
          it->abandoned = true;
          for (auto c = cache.begin(); c != cache.end(); ++c)
            if (c->second == it->entry) {
              cache.erase(c);
              break;
            }
          close_connection(it->conn, "group " + std::to_string(it->group)
                                         + " was not taken before the consumer's deadline");
          ++n;
        }
        ++it;
        continue;
      }
      ucp_request_free(it->request);
      if (s == UCS_OK)
        count_sent(it->bytes);
      else if (!it->conn->closed)
        say(options.log, "ucx producer: sending group " + std::to_string(it->group) + " to " + it->conn->peer
                             + " failed: " + ucs_status_string(s));
      release(it->entry);
      it = sends.erase(it);
      ++n;
    }
    if (retry_blocked) {
      retry_blocked = false;
      n += start_blocked();
    }
    return n;
  }

  unsigned start_blocked() {
    unsigned n = 0;
    while (!blocked.empty() && (cache.count(blocked.front().key) || cache.size() < options.max_packed_groups
                                || evict_one())) {
      auto j = std::move(blocked.front());
      blocked.pop_front();
      start_get(std::move(j));
      ++n;
    }
    return n;
  }

  // Deadlines of blocked gets, idle connections.
  void sweep(clock::time_point now) {
    for (std::size_t i = 0; i < blocked.size();) {
      if (now < blocked[i].deadline) {
        ++i;
        continue;
      }
      const auto j = blocked[i];
      blocked.erase(blocked.begin() + static_cast<std::ptrdiff_t>(i));
      count_rejected();
      reply(j.conn, wire::group_msg{j.seq, wire::status::busy,
                                    "no packing slot freed before the deadline ("
                                        + std::to_string(options.max_packed_groups)
                                        + " packed groups alive, all being sent)",
                                    j.group, 0, 0});
      finish_get(j);
    }
    std::vector<conn_ptr> idle;
    for (auto& [ep, c] : conns)
      if (c->outstanding == 0 && now - c->last_active > options.idle_timeout)
        idle.push_back(c);
    for (auto& c : idle)
      close_connection(c, "idle for longer than " + std::to_string(options.idle_timeout.count()) + " ms");
  }

  unsigned handle_packed() {
    std::deque<pack_result> done;
    {
      std::lock_guard<std::mutex> lock(pack_mutex);
      done.swap(pack_done);
    }
    for (auto& r : done) {
      auto it = cache.find(r.key);
      if (it == cache.end())
        continue; // cannot happen: packing entries are never evicted
      const entry_ptr e = it->second;
      e->buffer = std::move(r.buffer);
      e->size = r.size;
      e->checksum = r.checksum;
      e->error = r.error;
      e->st = r.error.empty() ? cache_entry::state::ready : cache_entry::state::failed;
      if (r.error.empty()) {
        std::lock_guard<std::mutex> lock(stats_mutex);
        ++st.packs;
        st.packed_bytes += r.size;
      } else {
        say(options.log, "ucx producer: packing failed: " + r.error);
      }
      auto waiters = std::move(e->waiters);
      e->waiters.clear();
      for (auto& j : waiters) {
        if (e->st == cache_entry::state::ready)
          send_group(std::move(j), e);
        else
          fail_get(j, e);
      }
    }
    return static_cast<unsigned>(done.size());
  }

  // -- packers ------------------------------------------------------------------------

  void pack_loop() {
    for (;;) {
      pack_job job;
      {
        std::unique_lock<std::mutex> lock(pack_mutex);
        pack_cv.wait(lock, [&] { return stopping || !pack_queue.empty(); });
        if (stopping)
          return;
        job = std::move(pack_queue.front());
        pack_queue.pop_front();
      }
      pack_result r;
      r.key = job.key;
      try {
        const std::uint32_t g = job.key.group;
        if (job.key.broadcast) {
          const auto& tensors = job.snapshot->group(g);
          const auto layout = plan::full_group_layout::of(tensors);
          r.size = static_cast<std::size_t>(layout.bytes);
          if (job.buffer.capacity() < r.size)
            job.buffer = host_buffer(r.size);
          pack_full_group(tensors, layout, job.buffer.data());
        } else {
          r.size = static_cast<std::size_t>(job.plan->bytes(g));
          if (job.buffer.capacity() < r.size)
            job.buffer = host_buffer(r.size);
          pack_group(*job.plan, g, *job.snapshot, job.buffer.data());
        }
        r.checksum = checksum64(job.buffer.data(), r.size);
      } catch (const std::exception& e) {
        r.error = e.what();
        r.size = 0;
      }
      r.buffer = std::move(job.buffer);
      {
        std::lock_guard<std::mutex> lock(pack_mutex);
        pack_done.push_back(std::move(r));
      }
      ucp_worker_signal(worker.handle); // thread-safe: wakes the progress thread
    }
  }

  // -- faults -------------------------------------------------------------------------

  bool take_corruption(const get_job& j) {
    if (!faults.take_corruption(j.engine, j.worker, j.version, j.group))
      return false;
    std::lock_guard<std::mutex> s(stats_mutex);
    ++st.corruptions;
    return true;
  }
};

ucx_producer::ucx_producer(std::shared_ptr<const weight_source> source, ucx_producer_options options)
    : impl_(std::make_unique<impl>()) {
  if (!source)
    throw std::invalid_argument("ucx producer: no weight source");
  impl_->source = std::move(source);
  impl_->options = std::move(options);
  impl_->options.max_packed_groups = std::max<std::size_t>(1, impl_->options.max_packed_groups);
  auto& o = impl_->options;
  o.max_outstanding_per_connection = std::max<std::size_t>(1, o.max_outstanding_per_connection);
  try {
    impl_->start();
  } catch (...) {
    impl_->stop();
    throw;
  }
}

ucx_producer::~ucx_producer() {
  impl_->stop();
}

std::uint16_t ucx_producer::port() const {
  return impl_->bound_port;
}

std::string ucx_producer::address() const {
  return impl_->bound_address;
}

const weight_source& ucx_producer::source() const {
  return *impl_->source;
}

ucx_producer_stats ucx_producer::stats() const {
  std::lock_guard<std::mutex> lock(impl_->stats_mutex);
  return impl_->st;
}

void ucx_producer::corrupt(corruption c) { impl_->faults.corrupt(std::move(c)); }

void ucx_producer::withhold(std::uint32_t group, std::uint64_t version) { impl_->faults.withhold(group, version); }

void ucx_producer::clear_faults() { impl_->faults.clear(); }

// =========================================================================================
// Puller
// =========================================================================================

namespace {

// One connection to the producer: a UCX worker of its own (UCX workers are
// single-threaded), one endpoint, the receive buffers. Used by one pull at
// a time; kept between pulls.
struct channel {
  std::string peer; // "host:port" as configured
  worker_handle worker;
  ucp_ep_h ep = nullptr;
  am_inbox inbox;
  am_outbox outbox;
  bool failed = false;
  std::string failure;
  std::set<std::uint64_t> plans; // digests registered on this connection
  std::uint64_t seq = 0;
  std::uint64_t tag = 0;
  std::map<std::uint64_t, wire::message> replies; // by seq; 0: a reject the producer could not attribute
  std::vector<host_buffer> slots;
  lane_info lanes;
  bool connected = false;  // the producer answered hello
  void* closing = nullptr; // a close that has not completed (see close_ep)

  static void on_error(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
    auto* self = static_cast<channel*>(arg);
    self->failed = true;
    self->failure = ucs_status_string(status);
  }

  // Decodes what arrived into `replies`; a reply that does not decode is a
  // broken producer.
  void pump() {
    inbox.poll();
    outbox.poll();
    while (!inbox.ready.empty()) {
      auto in = std::move(inbox.ready.front());
      inbox.ready.pop_front();
      if (in.too_big) {
        failed = true;
        failure = "the producer sent a reply of " + std::to_string(in.too_big) + " bytes";
        continue;
      }
      try {
        auto m = wire::decode(in.bytes.data(), in.bytes.size());
        const std::uint64_t s = std::visit([](const auto& x) { return x.seq; }, m);
        replies[s] = std::move(m);
      } catch (const wire::wire_error& e) {
        failed = true;
        failure = std::string("malformed reply: ") + e.what();
      }
    }
  }
};

struct registration {
  std::shared_ptr<const plan::worker_plan> plan;
  std::shared_ptr<const std::vector<std::uint8_t>> encoded;
  std::uint64_t digest = 0;
};

// A receive posted for one group.
struct posted {
  void* request = nullptr;
  bool done = false;
  ucs_status_t status = UCS_OK;
  std::size_t length = 0;
  std::uint64_t seq = 0;
};

} // namespace

struct ucx_puller::impl {
  ucx_puller_options options;
  std::unique_ptr<ucx_context> ctx;

  mutable std::mutex mutex;
  std::string producer;
  std::map<std::pair<std::string, int>, registration> workers;
  std::vector<std::unique_ptr<channel>> idle;
  std::vector<host_buffer> spare; // receive buffers of connections that were closed
  std::vector<std::unique_ptr<channel>> parked; // closing; see close_ep
  ucx_puller_stats st;
  std::string last_lanes;

  ~impl() {
    auto channels = std::move(idle);
    for (auto& ch : channels)
      destroy(std::move(ch));
    const auto until = clock::now() + std::chrono::milliseconds(500);
    for (;;) {
      reap_parked();
      std::lock_guard<std::mutex> lock(mutex);
      if (parked.empty() || clock::now() >= until)
        break;
    }
    if (!parked.empty()) {
      // Destroying these workers (or the context under them) would make
      // UCX abort the process: leak them instead.
      say(options.log, "ucx puller: " + std::to_string(parked.size())
                           + " connection(s) never closed; their UCX resources are leaked");
      for (auto& ch : parked)
        (void)ch.release();
      (void)ctx.release();
    }
    spare.clear();
    ctx.reset();
  }

  // -- connections --------------------------------------------------------------------

  std::unique_ptr<channel> acquire(const std::string& peer, const pull_request& req) {
    for (;;) {
      std::unique_ptr<channel> ch;
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (idle.empty())
          break;
        ch = std::move(idle.back());
        idle.pop_back();
      }
      // Notice a producer that went away while the connection was idle.
      for (int i = 0; i < 8; ++i)
        ucp_worker_progress(ch->worker.handle);
      ch->pump();
      if (!ch->failed && ch->peer == peer) {
        ch->replies.clear();
        return ch;
      }
      destroy(std::move(ch));
    }
    return connect(peer, req);
  }

  void release(std::unique_ptr<channel> ch) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (ch->peer == producer && !ch->failed) {
        idle.push_back(std::move(ch));
        return;
      }
    }
    destroy(std::move(ch)); // the producer changed meanwhile
  }

  // `grace` bounds each wait (the goodbye, the close); a close that takes
  // longer parks the connection.
  void destroy(std::unique_ptr<channel> ch,
               std::chrono::milliseconds grace = std::chrono::milliseconds(500)) {
    if (!ch)
      return;
    reap_parked();
    if (ch->worker.handle) {
      ch->inbox.cancel_all();
      if (ch->ep && ch->connected && !ch->failed) {
        // Say goodbye and let the producer close first (see its bye
        // handler): a close from this side would show there as a failed
        // endpoint, and closing that makes UCX log flush errors.
        if (ch->outbox.send(ch->ep, am_request, wire::encode(wire::bye_msg{++ch->seq}), true))
          drive(ch->worker, clock::now() + std::min(grace, std::chrono::milliseconds(200)), [&] {
            ch->pump();
            return ch->failed;
          }, std::chrono::milliseconds(1));
      }
      ch->outbox.poll();
      // See close_ep: close first if sends are outstanding, or if the
      // producer did not close its side.
      if (ch->ep && (!ch->outbox.inflight.empty() || (ch->connected && !ch->failed)))
        ch->closing = close_ep(ch->worker, ch->ep, grace);
      ch->ep = nullptr;
      if (ch->closing) {
        // Not safe to destroy yet (a partitioned producer): parked, retried later.
        say(options.log, "ucx puller: the connection to producer " + ch->peer
                             + " does not close; keeping its worker until it does");
        std::lock_guard<std::mutex> lock(mutex);
        parked.push_back(std::move(ch));
        return;
      }
      destroy_worker(*ch);
    }
    recycle_buffers(*ch);
  }

  void destroy_worker(channel& ch) {
    std::vector<std::vector<std::uint8_t>> keep; // bytes of sends UCX may hold until the worker goes
    ch.outbox.abandon(keep);
    ucp_worker_destroy(ch.worker.handle); // after this UCX touches none of our buffers
    ch.worker.handle = nullptr;
  }

  void recycle_buffers(channel& ch) {
    std::lock_guard<std::mutex> lock(mutex);
    for (auto& b : ch.slots)
      if (b.capacity() > 0 && spare.size() < 4 * std::max<std::size_t>(1, options.groups_in_flight))
        spare.push_back(std::move(b));
  }

  // Destroys parked workers whose close has completed.
  void reap_parked() {
    std::vector<std::unique_ptr<channel>> done;
    {
      std::lock_guard<std::mutex> lock(mutex);
      for (auto it = parked.begin(); it != parked.end();) {
        for (int i = 0; i < 8; ++i)
          ucp_worker_progress((*it)->worker.handle);
        if (ucp_request_check_status((*it)->closing) == UCS_INPROGRESS) {
          ++it;
          continue;
        }
        ucp_request_free((*it)->closing);
        (*it)->closing = nullptr;
        done.push_back(std::move(*it));
        it = parked.erase(it);
      }
    }
    for (auto& ch : done) {
      destroy_worker(*ch);
      recycle_buffers(*ch);
    }
  }

  std::unique_ptr<channel> new_channel(const std::string& peer) {
    auto ch = std::make_unique<channel>();
    ch->peer = peer;
    ch->worker = make_worker(ctx->handle, "puller");
    ch->inbox.install(ch->worker.handle, am_reply, std::size_t(256) << 20);
    return ch;
  }

  // Connects and says hello, retrying with backoff until the deadline.
  std::unique_ptr<channel> connect(const std::string& peer, const pull_request& req) {
    auto backoff = std::max(options.backoff_initial, std::chrono::milliseconds(1));
    std::string last = "no attempt made before the deadline";
    int attempts = 0;
    for (;;) {
      const auto now = clock::now();
      if (now >= req.deadline)
        break;
      ++attempts;
      {
        std::lock_guard<std::mutex> lock(mutex);
        ++st.connect_attempts;
      }
      const auto attempt_deadline = std::min(req.deadline, now + options.connect_attempt_timeout);
      // Each attempt on a worker of its own, destroyed with whatever a
      // failed attempt leaves behind.
      std::unique_ptr<channel> ch = new_channel(peer);
      if (auto err = try_connect(*ch, peer, attempt_deadline); err.empty()) {
        const std::string refused = lanes_refused(ch->lanes, options.transports);
        say(options.log, "ucx puller: " + who(req) + " connected to producer " + peer + " (attempt "
                             + std::to_string(attempts) + ") over " + ch->lanes.text + " [" + ch->lanes.summary()
                             + "]" + (refused.empty() ? "" : "; refused: " + refused));
        {
          std::lock_guard<std::mutex> lock(mutex);
          ++st.connections;
          last_lanes = ch->lanes.text + " [" + ch->lanes.summary() + "]";
        }
        if (!refused.empty()) {
          destroy(std::move(ch));
          throw transfer_error(transfer_failure::producer_failed,
                               "ucx transfer: " + who(req) + ": producer " + peer + ": " + refused);
        }
        return ch;
      } else {
        last = err;
      }
      // A failed attempt closes at once; an unanswered one may take until
      // the deadline, and is parked after that.
      destroy(std::move(ch), std::clamp(ms_until(req.deadline), std::chrono::milliseconds(10),
                                        std::chrono::milliseconds(500)));
      const auto pause = std::min<clock::duration>(backoff, req.deadline - clock::now());
      if (pause > clock::duration::zero())
        std::this_thread::sleep_for(pause);
      backoff = std::min(backoff * 2, std::max(options.backoff_max, backoff));
    }
    throw transfer_error(transfer_failure::timeout,
                         "ucx transfer: " + who(req) + ": could not connect to producer " + peer
                             + " before the deadline (" + std::to_string(attempts) + " attempt"
                             + (attempts == 1 ? "" : "s") + "; last: " + last + ")");
  }

  // "" on success.
  std::string try_connect(channel& ch, const std::string& peer, clock::time_point deadline) {
    sockaddr_storage addr{};
    socklen_t len = 0;
    try {
      addr = resolve(split_address(peer), len, false);
    } catch (const std::exception& e) {
      return e.what();
    }
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_ERR_HANDLER
                    | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
    ep.sockaddr.addrlen = len;
    ep.err_mode = UCP_ERR_HANDLING_MODE_NONE; // PEER would restrict UCX to tcp lanes
    ep.err_handler.cb = &channel::on_error;
    ep.err_handler.arg = &ch;
    const ucs_status_t s = ucp_ep_create(ch.worker.handle, &ep, &ch.ep);
    if (s != UCS_OK) {
      ch.ep = nullptr;
      return std::string("cannot create an endpoint: ") + ucs_status_string(s);
    }
    const std::uint64_t seq = ++ch.seq;
    if (!ch.outbox.send(ch.ep, am_request, wire::encode(wire::hello_msg{seq}), true))
      return "cannot send";
    const bool answered = drive(ch.worker, deadline, [&] {
      ch.pump();
      return ch.failed || ch.replies.count(seq) || ch.replies.count(0);
    });
    if (ch.failed)
      return ch.failure;
    if (!answered)
      return "no answer within " + std::to_string(options.connect_attempt_timeout.count()) + " ms";
    auto it = ch.replies.find(seq);
    if (it == ch.replies.end())
      it = ch.replies.find(0);
    if (const auto* a = std::get_if<wire::ack_msg>(&it->second); a && a->status == wire::status::ok) {
      ch.replies.erase(it);
      ch.lanes = ep_lanes(ch.ep);
      ch.connected = true;
      return {};
    }
    return "unexpected answer to hello";
  }

  // -- request/reply ------------------------------------------------------------------

  [[noreturn]] void lost(channel& ch, const pull_request& req, const std::string& doing) {
    const bool reset = ch.failure.find("reset") != std::string::npos || ch.failure.find("closed") != std::string::npos;
    throw transfer_error(reset ? transfer_failure::cancelled : transfer_failure::producer_failed,
                         "ucx transfer: " + who(req) + ": the connection to producer " + ch.peer + " failed while "
                             + doing + ": " + ch.failure);
  }

  void send(channel& ch, const pull_request& req, const wire::message& m, const std::string& doing) {
    if (!ch.outbox.send(ch.ep, am_request, wire::encode(m), true)) {
      ch.failed = true;
      ch.failure = "cannot send";
      lost(ch, req, doing);
    }
  }

  // Waits for the reply with sequence `seq`; throws on failure or timeout.
  wire::message await(channel& ch, const pull_request& req, std::uint64_t seq, const std::string& doing) {
    const bool ok = drive(ch.worker, req.deadline, [&] {
      ch.pump();
      return ch.failed || ch.replies.count(seq) || ch.replies.count(0);
    });
    if (ch.failed)
      lost(ch, req, doing);
    if (!ok)
      throw transfer_error(transfer_failure::timeout, "ucx transfer: " + who(req) + ": producer " + ch.peer
                                                          + " did not answer before the deadline while " + doing);
    auto it = ch.replies.find(seq);
    if (it == ch.replies.end())
      it = ch.replies.find(0);
    auto m = std::move(it->second);
    ch.replies.erase(it);
    if (const auto* r = std::get_if<wire::reject_msg>(&m))
      throw transfer_error(failure_of(r->status), "ucx transfer: " + who(req) + ": producer " + ch.peer
                                                      + " rejected the request while " + doing + " ("
                                                      + wire::to_string(r->status) + "): " + r->error);
    return m;
  }

  void register_plan(channel& ch, const pull_request& req, const registration& r) {
    if (ch.plans.count(r.digest))
      return;
    const std::uint64_t seq = ++ch.seq;
    send(ch, req, wire::plan_msg{seq, *r.encoded}, "registering the sharding plan");
    auto m = await(ch, req, seq, "registering the sharding plan");
    const auto* a = std::get_if<wire::ack_msg>(&m);
    if (!a)
      throw transfer_error(transfer_failure::producer_failed, "ucx transfer: " + who(req) + ": producer " + ch.peer
                                                                  + " answered the plan with no ack");
    if (a->status != wire::status::ok)
      throw transfer_error(failure_of(a->status), "ucx transfer: " + who(req) + ": producer " + ch.peer
                                                      + " refused the sharding plan: " + a->error);
    if (a->digest != r.digest)
      throw transfer_error(transfer_failure::producer_failed, "ucx transfer: " + who(req) + ": producer " + ch.peer
                                                                  + " acknowledged plan " + hex(a->digest)
                                                                  + ", sent " + hex(r.digest));
    ch.plans.insert(r.digest);
  }

  // -- the pull -----------------------------------------------------------------------

  pull_report pull(const pull_request& req, const group_sink& sink) {
    const auto t0 = clock::now();
    const bool broadcast = req.mode == transfer_mode::broadcast;
    if (broadcast ? !sink.on_full_group : !sink.on_group)
      throw std::invalid_argument("ucx transfer: " + who(req) + ": no sink for " + to_string(req.mode) + " groups");
    registration reg;
    std::string peer;
    {
      std::lock_guard<std::mutex> lock(mutex);
      auto it = workers.find({req.engine, req.worker});
      if (it == workers.end())
        throw transfer_error(transfer_failure::not_registered,
                             "ucx transfer: " + who(req) + " has not registered its sharding plan");
      reg = it->second;
      peer = producer;
    }
    if (peer.empty())
      throw std::invalid_argument("ucx transfer: " + who(req) + ": no producer address set");

    std::unique_ptr<channel> ch = acquire(peer, req);
    struct guard {
      impl* self;
      std::unique_ptr<channel>& ch;
      ~guard() {
        // A failed pull leaves the connection in an unknown state: drop it,
        // waiting little (the caller's deadline may have passed already).
        if (ch)
          self->destroy(std::move(ch), std::chrono::milliseconds(50));
      }
    } g{this, ch};

    if (!broadcast)
      register_plan(*ch, req, reg);

    // Open the version.
    const std::uint64_t open_seq = ++ch->seq;
    const wire::open_msg open{open_seq,    req.engine, req.worker, reg.plan->tp,
                              req.version, req.mode,   broadcast ? 0 : reg.digest};
    send(*ch, req, open, "opening version " + std::to_string(req.version));
    auto reply = await(*ch, req, open_seq, "opening version " + std::to_string(req.version));
    auto* manifest = std::get_if<wire::manifest_msg>(&reply);
    if (!manifest)
      throw transfer_error(transfer_failure::producer_failed,
                           "ucx transfer: " + who(req) + ": producer " + ch->peer + " answered open with no manifest");
    if (manifest->status != wire::status::ok)
      throw transfer_error(failure_of(manifest->status), "ucx transfer: " + who(req) + ": producer " + ch->peer + ": "
                                                             + manifest->error);
    const auto& groups = manifest->groups;
    std::vector<plan::full_group_layout> layouts(broadcast ? groups.size() : 0);
    std::uint64_t largest = 0;
    for (std::size_t i = 0; i < groups.size(); ++i) {
      auto bad = [&](const std::string& why) {
        throw transfer_error(transfer_failure::producer_failed,
                             "ucx transfer: " + who(req) + ": producer " + ch->peer + " sent a bad manifest: " + why);
      };
      if (i > 0 && groups[i].group <= groups[i - 1].group)
        bad("groups out of order");
      if (groups[i].bytes > options.max_group_bytes)
        bad("group " + std::to_string(groups[i].group) + " of " + std::to_string(groups[i].bytes)
            + " bytes exceeds max_group_bytes");
      if (broadcast) {
        std::vector<tensor_view> views;
        for (const auto& s : groups[i].tensors) {
          tensor_view v;
          static_cast<tensor_spec&>(v) = s;
          v.size = static_cast<std::size_t>(s.bytes());
          views.push_back(std::move(v));
        }
        layouts[i] = plan::full_group_layout::of(views);
        if (layouts[i].bytes != groups[i].bytes)
          bad("group " + std::to_string(groups[i].group) + " announces " + std::to_string(groups[i].bytes)
              + " bytes, its tensors take " + std::to_string(layouts[i].bytes));
      }
      largest = std::max(largest, groups[i].bytes);
    }

    // Receive buffers: allocated and touched once, reused by later pulls.
    const std::size_t window = std::min<std::size_t>(std::max<std::size_t>(1, options.groups_in_flight), groups.size());
    ensure_slots(*ch, window, static_cast<std::size_t>(largest));

    pull_report report;
    report.engine = req.engine;
    report.worker = req.worker;
    report.version = req.version;
    std::vector<posted> slot_state(window);
    // A failed pull leaves receives posted. While the producer is healthy
    // and the deadline not past (a checksum mismatch, a throwing sink),
    // let them complete for a moment: the producer's sends then finish
    // normally instead of failing with the connection. Then cancel and
    // release the rest before the connection (and its buffers) goes.
    struct cancel_guard {
      channel& ch;
      std::vector<posted>& posts;
      clock::time_point deadline;
      ~cancel_guard() {
        auto pending = [&] {
          return std::any_of(posts.begin(), posts.end(), [](const posted& p) { return p.request != nullptr; });
        };
        if (pending() && !ch.failed && clock::now() < deadline)
          drive(ch.worker, std::min(deadline, clock::now() + std::chrono::milliseconds(200)), [&] {
            for (auto& p : posts)
              if (p.request && ucp_request_check_status(p.request) != UCS_INPROGRESS) {
                ucp_request_free(p.request);
                p.request = nullptr;
              }
            return !pending();
          }, std::chrono::milliseconds(1));
        for (auto& p : posts)
          if (p.request) {
            ucp_request_cancel(ch.worker.handle, p.request);
            ucp_request_free(p.request);
            p.request = nullptr;
          }
      }
    } cancel{*ch, slot_state, req.deadline};

    auto issue = [&](std::size_t idx) {
      auto& p = slot_state[idx % window];
      p = posted{};
      const std::uint64_t tag = ++ch->tag;
      ucp_request_param_t rp{};
      rp.op_attr_mask = 0;
      void* r = ucp_tag_recv_nbx(ch->worker.handle, ch->slots[idx % window].data(),
                                 static_cast<std::size_t>(groups[idx].bytes), tag, ~std::uint64_t(0), &rp);
      if (UCS_PTR_IS_ERR(r)) {
        ch->failed = true;
        ch->failure = std::string("cannot post a receive: ") + ucs_status_string(UCS_PTR_STATUS(r));
        lost(*ch, req, "requesting group " + std::to_string(groups[idx].group));
      }
      p.request = r;
      p.seq = ++ch->seq;
      const auto left = ms_until(req.deadline).count();
      const auto timeout = static_cast<std::uint32_t>(std::clamp<std::int64_t>(left, 1, UINT32_MAX));
      send(*ch, req, wire::get_msg{p.seq, manifest->session, groups[idx].group, tag, timeout},
           "requesting group " + std::to_string(groups[idx].group));
    };
    auto settle = [&](posted& p) {
      if (p.done || !p.request)
        return;
      ucp_tag_recv_info_t info{};
      const ucs_status_t s = ucp_tag_recv_request_test(p.request, &info);
      if (s == UCS_INPROGRESS)
        return;
      p.done = true;
      p.status = s;
      p.length = info.length;
      ucp_request_free(p.request);
      p.request = nullptr;
    };

    for (std::size_t idx = 0; idx < window; ++idx)
      issue(idx);
    for (std::size_t idx = 0; idx < groups.size(); ++idx) {
      const std::uint32_t group = groups[idx].group;
      auto& p = slot_state[idx % window];
      const std::string doing =
          "receiving group " + std::to_string(group) + " of version " + std::to_string(req.version);
      const wire::group_msg* header = nullptr;
      const bool arrived = drive(ch->worker, req.deadline, [&] {
        ch->pump();
        settle(p);
        auto it = ch->replies.find(p.seq);
        header = it == ch->replies.end() ? nullptr : std::get_if<wire::group_msg>(&it->second);
        return ch->failed || ch->replies.count(0) || (it != ch->replies.end() && !header)
               || (header && (header->status != wire::status::ok || p.done));
      });
      if (ch->failed)
        lost(*ch, req, doing);
      if (!arrived)
        throw transfer_error(transfer_failure::timeout,
                             "ucx transfer: " + who(req) + ": group " + std::to_string(group) + " of version "
                                 + std::to_string(req.version) + " did not arrive from producer " + ch->peer
                                 + " before the deadline; " + std::to_string(idx) + " of "
                                 + std::to_string(groups.size()) + " groups received");
      if (!header) {
        (void)await(*ch, req, p.seq, doing); // throws for a reject
        throw transfer_error(transfer_failure::producer_failed, "ucx transfer: " + who(req) + ": producer " + ch->peer
                                                                    + " answered a get with something else");
      }
      if (header->status != wire::status::ok)
        throw transfer_error(failure_of(header->status), "ucx transfer: " + who(req) + ": producer " + ch->peer
                                                             + " could not send group " + std::to_string(group)
                                                             + " of version " + std::to_string(req.version) + " ("
                                                             + wire::to_string(header->status) + "): " + header->error);
      if (p.status != UCS_OK || header->group != group || header->bytes != groups[idx].bytes
          || p.length != groups[idx].bytes)
        throw transfer_error(transfer_failure::producer_failed,
                             "ucx transfer: " + who(req) + ": group " + std::to_string(group) + " of version "
                                 + std::to_string(req.version) + " from producer " + ch->peer + " arrived damaged ("
                                 + (p.status != UCS_OK ? std::string(ucs_status_string(p.status))
                                                       : std::to_string(p.length) + " bytes received, "
                                                             + std::to_string(header->bytes) + " announced for group "
                                                             + std::to_string(header->group) + ", "
                                                             + std::to_string(groups[idx].bytes) + " expected")
                                 + ")");
      const std::uint8_t* bytes = ch->slots[idx % window].data();
      const std::size_t size = p.length;
      const std::uint64_t got = checksum64(bytes, size);
      if (got != header->checksum)
        throw transfer_error(transfer_failure::checksum_mismatch,
                             "ucx transfer: " + who(req) + ": group " + std::to_string(group) + " of version "
                                 + std::to_string(req.version) + " failed its checksum (sent " + hex(header->checksum)
                                 + ", received " + hex(got) + " over " + std::to_string(size)
                                 + " bytes from producer " + ch->peer + "); the update is void");
      ch->replies.erase(p.seq);
      report.bytes += size;
      ++report.groups;
      if (broadcast)
        sink.on_full_group(req.worker, group, plan::view_full_group(layouts[idx], bytes));
      else
        sink.on_group(req.worker, group, bytes, size);
      if (idx + window < groups.size())
        issue(idx + window);
    }
    // The session is done; no answer is awaited (a lost close only keeps a
    // session the producer drops later).
    const std::uint64_t close_seq = ++ch->seq;
    ch->outbox.send(ch->ep, am_request, wire::encode(wire::close_msg{close_seq, manifest->session}), true);
    ch->pump();
    report.duration = clock::now() - t0;
    {
      std::lock_guard<std::mutex> lock(mutex);
      ++st.pulls;
      st.bytes += report.bytes;
    }
    release(std::move(ch));
    return report;
  }

  void ensure_slots(channel& ch, std::size_t window, std::size_t size) {
    if (ch.slots.size() < window)
      ch.slots.resize(window);
    for (std::size_t i = 0; i < window; ++i) {
      if (ch.slots[i].capacity() >= size && (size > 0 || ch.slots[i].capacity() > 0))
        continue;
      // A spare buffer of a closed connection, else a new one (touched now,
      // not while the bytes arrive).
      host_buffer b;
      {
        std::lock_guard<std::mutex> lock(mutex);
        auto it = std::find_if(spare.begin(), spare.end(), [&](const host_buffer& s) { return s.capacity() >= size; });
        if (it != spare.end()) {
          b = std::move(*it);
          spare.erase(it);
        }
      }
      if (b.capacity() < std::max<std::size_t>(size, 1)) {
        b = host_buffer(std::max<std::size_t>(size, 1));
        std::lock_guard<std::mutex> lock(mutex);
        ++st.buffers;
        st.buffer_bytes += b.capacity();
      }
      ch.slots[i] = std::move(b);
    }
  }
};

ucx_puller::ucx_puller(ucx_puller_options options) : impl_(std::make_unique<impl>()) {
  options.groups_in_flight = std::max<std::size_t>(1, options.groups_in_flight);
  if (!options.producer.empty())
    split_address(options.producer); // throws for a malformed one
  impl_->producer = options.producer;
  impl_->options = std::move(options);
  impl_->ctx = make_context(impl_->options.transports, impl_->options.net_devices, "puller");
}

ucx_puller::~ucx_puller() = default;

void ucx_puller::set_producer(const std::string& address) {
  split_address(address);
  std::vector<std::unique_ptr<channel>> old;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    if (impl_->producer == address)
      return;
    impl_->producer = address;
    old.swap(impl_->idle);
  }
  for (auto& ch : old)
    impl_->destroy(std::move(ch));
}

std::string ucx_puller::producer() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->producer;
}

void ucx_puller::register_worker(const std::string& engine, std::shared_ptr<const plan::worker_plan> plan) {
  if (!plan)
    throw std::invalid_argument("ucx transfer: engine '" + engine + "' registered no plan");
  try {
    wire::check_plan(*plan);
  } catch (const wire::wire_error& e) {
    throw std::invalid_argument("ucx transfer: engine '" + engine + "' worker " + std::to_string(plan->worker) + ": "
                                + e.what());
  }
  registration r;
  auto encoded = std::make_shared<std::vector<std::uint8_t>>(wire::encode_plan(*plan));
  r.digest = checksum64(encoded->data(), encoded->size());
  r.encoded = std::move(encoded);
  r.plan = std::move(plan);
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->workers[{engine, r.plan->worker}] = std::move(r);
}

void ucx_puller::unregister_engine(const std::string& engine) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  for (auto it = impl_->workers.begin(); it != impl_->workers.end();)
    it = it->first.first == engine ? impl_->workers.erase(it) : std::next(it);
}

pull_report ucx_puller::pull(const pull_request& req, const group_sink& sink) {
  return impl_->pull(req, sink);
}

ucx_puller_stats ucx_puller::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->st;
}

std::string ucx_puller::last_transports() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->last_lanes;
}

std::string ucx_puller::send_raw(const std::vector<std::uint8_t>& message, clock::time_point deadline) {
  pull_request req;
  req.engine = "(raw)";
  req.deadline = deadline;
  auto ch = impl_->connect(producer(), req);
  std::string out;
  if (ch->outbox.send(ch->ep, am_request, message, true)) {
    drive(ch->worker, deadline, [&] {
      ch->pump();
      return ch->failed || !ch->replies.empty();
    });
    if (!ch->replies.empty()) {
      std::visit(
          [&](const auto& m) {
            using T = std::decay_t<decltype(m)>;
            if constexpr (std::is_same_v<T, wire::reject_msg> || std::is_same_v<T, wire::ack_msg>
                          || std::is_same_v<T, wire::group_msg> || std::is_same_v<T, wire::manifest_msg>)
              out = wire::to_string(m.status) + ": " + m.error;
            else
              out = "unexpected reply";
          },
          ch->replies.begin()->second);
    }
  }
  impl_->destroy(std::move(ch));
  return out;
}

} // namespace rlsync::transfer
