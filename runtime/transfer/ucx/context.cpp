#include "runtime/transfer/ucx/context.hpp"

#include <uct/api/uct.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>

namespace rlsync::transfer {
namespace ucx_detail {

namespace {

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
// missing. tcp is always added when present, so that two ends whose lists
// share no transport meet over tcp and the lane check on the endpoint
// refuses it naming tcp (instead of an unreachable destination); that
// check keeps tcp from carrying data unless the list names it.
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

} // namespace

std::unique_ptr<ucx_context> make_context(const std::vector<ucx_transport>& named, const std::string& net_devices,
                                          const std::string& role) {
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

std::vector<std::uint8_t> worker_address(ucp_worker_h w, const std::string& role) {
  ucp_address_t* a = nullptr;
  std::size_t len = 0;
  if (const ucs_status_t s = ucp_worker_get_address(w, &a, &len); s != UCS_OK)
    throw ucx_error("ucx " + role + ": cannot get the worker's address: " + ucs_status_string(s));
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(a);
  std::vector<std::uint8_t> out(bytes, bytes + len);
  ucp_worker_release_address(w, a);
  return out;
}

std::string lane_info::summary() const {
  std::string s;
  for (auto k : all_kinds())
    if (kinds.count(k))
      s += (s.empty() ? "" : "/") + std::string(to_string(k));
  return s.empty() ? "none" : s;
}

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

} // namespace ucx_detail

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
  return ucx_detail::describe(ucx_detail::make_catalog(""));
}

} // namespace rlsync::transfer
