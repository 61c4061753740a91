#include "runtime/transfer/ucx/ucx_wire.hpp"

#include <openssl/sha.h>

#include <cstring>
#include <limits>
#include <type_traits>

namespace rlsync::transfer::ucx_wire {

namespace {

constexpr std::uint32_t message_magic = 0x58554c52; // "RLUX" as little-endian bytes
constexpr std::uint32_t plan_magic = 0x4c504c52;    // "RLPL"
// 2: group checksums and plan digests are XXH3 (64-bit); 1 used XXH64. A peer
// of the other version is refused at the first message instead of failing
// every checksum. 3: hello carries the engine worker and its session token.
// 7: an ack names the producer's shareable buffers (connecting ahead).
// 8: a manifest places each group's tensors in the version's memory (lent in place).
// 9: plan digests are SHA-256's first 8 bytes (plan_digest).
// 10: hello carries the consumer's worker address, as its first message's header.
constexpr std::uint8_t format_version = 10;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the wire format is written with host-order stores");

class writer {
public:
  template <class T>
  void put(T v) {
    static_assert(std::is_integral_v<T>);
    const auto n = out_.size();
    out_.resize(n + sizeof v);
    std::memcpy(out_.data() + n, &v, sizeof v);
  }
  void str(const std::string& s) {
    put(static_cast<std::uint32_t>(s.size()));
    out_.insert(out_.end(), s.begin(), s.end());
  }
  void blob(const std::vector<std::uint8_t>& b) {
    put(static_cast<std::uint32_t>(b.size()));
    out_.insert(out_.end(), b.begin(), b.end());
  }
  void shape(const std::vector<std::int64_t>& s) {
    put(static_cast<std::uint8_t>(s.size()));
    for (auto d : s)
      put(d);
  }
  std::vector<std::uint8_t> take() { return std::move(out_); }

private:
  std::vector<std::uint8_t> out_;
};

// Reads only inside [data, data + size); every failure names what was being
// read (`what`, set by the caller as it walks the structure) and where.
class reader {
public:
  reader(const std::uint8_t* data, std::size_t size, std::string what) : p_(data), n_(size), what_(std::move(what)) {}

  [[noreturn]] void fail(const std::string& why) const {
    throw wire_error(what_ + ": " + why + " at byte " + std::to_string(at_));
  }
  void context(std::string what) { what_ = std::move(what); }
  std::size_t left() const { return n_ - at_; }
  std::size_t offset() const { return at_; }

  template <class T>
  T get(const char* field) {
    static_assert(std::is_integral_v<T>);
    if (left() < sizeof(T))
      fail(std::string("truncated reading ") + field);
    T v;
    std::memcpy(&v, p_ + at_, sizeof v);
    at_ += sizeof v;
    return v;
  }
  std::string str(const char* field, std::size_t limit = max_string_bytes) {
    const auto len = get<std::uint32_t>(field);
    if (len > limit)
      fail(std::string(field) + " of " + std::to_string(len) + " bytes exceeds the limit of " + std::to_string(limit));
    if (len > left())
      fail(std::string("truncated reading ") + field + " (" + std::to_string(len) + " bytes announced, "
           + std::to_string(left()) + " left)");
    std::string s(reinterpret_cast<const char*>(p_ + at_), len);
    at_ += len;
    return s;
  }
  std::vector<std::uint8_t> blob(const char* field, std::size_t limit = std::numeric_limits<std::uint32_t>::max()) {
    const auto len = get<std::uint32_t>(field);
    if (len > limit)
      fail(std::string(field) + " of " + std::to_string(len) + " bytes exceeds the limit of " + std::to_string(limit));
    if (len > left())
      fail(std::string("truncated reading ") + field + " (" + std::to_string(len) + " bytes announced, "
           + std::to_string(left()) + " left)");
    std::vector<std::uint8_t> b(p_ + at_, p_ + at_ + len);
    at_ += len;
    return b;
  }
  /// A count of elements that each take at least `min_element_bytes`:
  /// checked against the limit and against the bytes left before anything
  /// is allocated for them.
  template <class T>
  std::size_t count(const char* field, std::size_t limit, std::size_t min_element_bytes) {
    const auto n = static_cast<std::size_t>(get<T>(field));
    if (n > limit)
      fail(std::string(field) + " " + std::to_string(n) + " exceeds the limit of " + std::to_string(limit));
    if (min_element_bytes > 0 && n > left() / min_element_bytes)
      fail(std::string(field) + " " + std::to_string(n) + " cannot fit in the " + std::to_string(left())
           + " bytes left");
    return n;
  }
  std::vector<std::int64_t> shape(const char* field) {
    const auto rank = count<std::uint8_t>(field, max_rank, sizeof(std::int64_t));
    std::vector<std::int64_t> s(rank);
    for (auto& d : s)
      d = get<std::int64_t>(field);
    return s;
  }
  dtype type(const char* field) {
    const auto t = get<std::uint8_t>(field);
    if (t > static_cast<std::uint8_t>(dtype::f32))
      fail(std::string(field) + ": unknown dtype " + std::to_string(t));
    return static_cast<dtype>(t);
  }
  void done() const {
    if (left() != 0)
      fail(std::to_string(left()) + " trailing bytes");
  }

private:
  const std::uint8_t* p_;
  std::size_t n_;
  std::size_t at_ = 0;
  std::string what_;
};

std::string entry_name(std::size_t i, const plan::plan_entry& e) {
  return "plan entry " + std::to_string(i) + (e.source.empty() ? std::string() : " ('" + e.source + "')");
}

// a * b, or false when it overflows int64.
bool mul(std::int64_t a, std::int64_t b, std::int64_t& out) {
  return !__builtin_mul_overflow(a, b, &out);
}
bool add(std::int64_t a, std::int64_t b, std::int64_t& out) {
  return !__builtin_add_overflow(a, b, &out);
}

} // namespace

std::string to_string(status s) {
  switch (s) {
    case status::ok: return "ok";
    case status::bad_request: return "bad_request";
    case status::not_registered: return "not_registered";
    case status::version_unavailable: return "version_unavailable";
    case status::producer_failed: return "producer_failed";
    case status::busy: return "busy";
    case status::shutting_down: return "shutting_down";
    case status::not_allowed: return "not_allowed";
    case status::unauthorized: return "unauthorized";
  }
  return "status(" + std::to_string(static_cast<int>(s)) + ")";
}

// -- plans ---------------------------------------------------------------------------------

std::vector<std::uint8_t> encode_plan(const plan::worker_plan& p) {
  writer w;
  w.put(plan_magic);
  w.put(format_version);
  w.put(static_cast<std::int32_t>(p.tp));
  w.put(static_cast<std::int32_t>(p.worker));
  w.put(static_cast<std::uint32_t>(p.entries.size()));
  for (const auto& e : p.entries) {
    w.str(e.source);
    w.put(static_cast<std::uint8_t>(e.source_type));
    w.shape(e.source_shape);
    w.put(static_cast<std::uint16_t>(e.ops.size()));
    for (const auto& op : e.ops)
      w.str(op);
    w.put(static_cast<std::int64_t>(e.view.offset));
    w.put(static_cast<std::uint8_t>(e.view.shape.size()));
    for (auto d : e.view.shape)
      w.put(static_cast<std::int64_t>(d));
    for (auto s : e.view.strides)
      w.put(static_cast<std::int64_t>(s));
    w.str(e.param);
    w.put(static_cast<std::int64_t>(e.dst_offset));
  }
  return w.take();
}

plan::worker_plan decode_plan(const std::uint8_t* data, std::size_t size) {
  reader r(data, size, "plan");
  if (r.get<std::uint32_t>("magic") != plan_magic)
    r.fail("not a plan (bad magic)");
  if (const auto v = r.get<std::uint8_t>("format version"); v != format_version)
    r.fail("format version " + std::to_string(v) + ", expected " + std::to_string(format_version));
  plan::worker_plan p;
  p.tp = r.get<std::int32_t>("tp");
  p.worker = r.get<std::int32_t>("worker");
  // The smallest entry: five empty strings/lengths, dtype, rank 0 shapes,
  // no ops, offset and dst_offset.
  constexpr std::size_t min_entry = 4 + 1 + 1 + 2 + 8 + 1 + 4 + 8;
  const auto n = r.count<std::uint32_t>("entry count", max_plan_entries, min_entry);
  p.entries.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    auto& e = p.entries[i];
    r.context("plan entry " + std::to_string(i));
    e.source = r.str("source name");
    r.context(entry_name(i, e));
    e.source_type = r.type("source dtype");
    e.source_shape = r.shape("source shape");
    const auto ops = r.count<std::uint16_t>("op count", max_ops, 4);
    e.ops.reserve(ops);
    for (std::size_t k = 0; k < ops; ++k)
      e.ops.push_back(r.str("op"));
    e.view.offset = r.get<std::int64_t>("view offset");
    const auto rank = r.count<std::uint8_t>("view rank", max_rank, 2 * sizeof(std::int64_t));
    e.view.shape.resize(rank);
    e.view.strides.resize(rank);
    for (auto& d : e.view.shape)
      d = r.get<std::int64_t>("view shape");
    for (auto& s : e.view.strides)
      s = r.get<std::int64_t>("view strides");
    e.param = r.str("parameter name");
    e.dst_offset = r.get<std::int64_t>("destination offset");
  }
  r.context("plan");
  r.done();
  check_plan(p);
  return p;
}

void check_plan(const plan::worker_plan& p) {
  if (p.tp < 1 || p.tp > max_tp)
    throw wire_error("plan: tp " + std::to_string(p.tp) + " out of range [1, " + std::to_string(max_tp) + "]");
  if (p.worker < 0 || p.worker >= p.tp)
    throw wire_error("plan: worker " + std::to_string(p.worker) + " out of range for tp " + std::to_string(p.tp));
  if (p.entries.size() > max_plan_entries)
    throw wire_error("plan: " + std::to_string(p.entries.size()) + " entries exceed the limit");
  for (std::size_t i = 0; i < p.entries.size(); ++i) {
    const auto& e = p.entries[i];
    auto bad = [&](const std::string& why) { throw wire_error(entry_name(i, e) + ": " + why); };
    if (e.source.empty() || e.source.size() > max_string_bytes)
      bad("bad source name");
    if (e.param.empty() || e.param.size() > max_string_bytes)
      bad("bad parameter name");
    if (e.ops.size() > max_ops)
      bad("too many ops");
    if (static_cast<std::uint8_t>(e.source_type) > static_cast<std::uint8_t>(dtype::f32))
      bad("unknown dtype");
    if (e.source_shape.size() > max_rank || e.view.shape.size() > max_rank)
      bad("rank exceeds " + std::to_string(max_rank));
    if (e.view.shape.size() != e.view.strides.size())
      bad("view has " + std::to_string(e.view.shape.size()) + " dimensions but "
          + std::to_string(e.view.strides.size()) + " strides");
    if (e.dst_offset < 0)
      bad("negative destination offset");
    // Elements of the source; bytes must fit too (dtype size <= 4).
    std::int64_t source_numel = 1;
    for (auto d : e.source_shape)
      if (d < 0 || !mul(source_numel, d, source_numel))
        bad("bad source shape " + shape_string(e.source_shape));
    if (std::int64_t bytes; !mul(source_numel, 4, bytes))
      bad("source tensor too large");
    std::int64_t view_numel = 1;
    for (auto d : e.view.shape)
      if (d < 0 || !mul(view_numel, d, view_numel))
        bad("bad view shape " + shape_string(e.view.shape));
    // A view selects distinct elements of its source (narrow, transpose and
    // reshape never alias), so it is never larger: this bounds what one
    // entry makes a producer allocate and copy.
    if (view_numel > source_numel)
      bad("view of " + std::to_string(view_numel) + " elements is larger than its source of "
          + std::to_string(source_numel));
    if (view_numel == 0)
      continue;
    // The lowest and highest element index the view touches.
    std::int64_t lo = e.view.offset, hi = e.view.offset;
    for (std::size_t d = 0; d < e.view.shape.size(); ++d) {
      std::int64_t span;
      if (!mul(e.view.shape[d] - 1, e.view.strides[d], span))
        bad("view strides overflow");
      std::int64_t& end = span < 0 ? lo : hi; // negative strides move the low end
      if (!add(end, span, end))
        bad("view strides overflow");
    }
    if (lo < 0 || hi >= source_numel)
      bad("view reads elements [" + std::to_string(lo) + ", " + std::to_string(hi) + "] outside its source of "
          + std::to_string(source_numel) + " elements " + shape_string(e.source_shape));
  }
}

// -- messages ------------------------------------------------------------------------------

namespace {

void header(writer& w, msg_type t) {
  w.put(message_magic);
  w.put(format_version);
  w.put(static_cast<std::uint8_t>(t));
}

void put_specs(writer& w, const std::vector<tensor_spec>& specs) {
  w.put(static_cast<std::uint32_t>(specs.size()));
  for (const auto& s : specs) {
    w.str(s.name);
    w.put(static_cast<std::uint8_t>(s.type));
    w.shape(s.shape);
  }
}

status get_status(reader& r) {
  const auto s = r.get<std::uint8_t>("status");
  if (s > max_status)
    r.fail("unknown status " + std::to_string(s));
  return static_cast<status>(s);
}

bool get_flag(reader& r, const char* field) {
  const auto f = r.get<std::uint8_t>(field);
  if (f > 1)
    r.fail(std::string(field) + " flag " + std::to_string(f) + ", expected 0 or 1");
  return f == 1;
}

void put_region(writer& w, const shared_region& x) {
  w.put(x.pid);
  w.put(x.fd);
  w.put(x.bytes);
  w.put(x.id);
}

shared_region get_region(reader& r, const char* field) {
  shared_region x;
  x.pid = r.get<std::uint32_t>(field);
  x.fd = r.get<std::int32_t>(field);
  x.bytes = r.get<std::uint64_t>(field);
  x.id = r.get<std::uint64_t>(field);
  // A region is named whole or not at all; its length is bounded like a group's.
  if (x.id != 0 && (x.pid == 0 || x.fd < 0 || x.bytes <= shared_header_bytes || x.bytes > max_shared_bytes))
    r.fail(std::string(field) + ": pid " + std::to_string(x.pid) + ", fd " + std::to_string(x.fd) + ", "
           + std::to_string(x.bytes) + " bytes is no shared buffer");
  return x;
}

std::vector<tensor_spec> get_specs(reader& r) {
  constexpr std::size_t min_spec = 4 + 1 + 1;
  const auto n = r.count<std::uint32_t>("tensor count", max_group_tensors, min_spec);
  std::vector<tensor_spec> specs(n);
  for (auto& s : specs) {
    s.name = r.str("tensor name");
    s.type = r.type("tensor dtype");
    s.shape = r.shape("tensor shape");
    std::int64_t numel = 1;
    for (auto d : s.shape)
      if (d < 0 || !mul(numel, d, numel) || !mul(numel, 4, numel))
        r.fail("tensor '" + s.name + "': bad shape " + shape_string(s.shape));
  }
  return specs;
}

} // namespace

std::uint64_t plan_digest(const std::uint8_t* data, std::size_t size) {
  unsigned char sha[SHA256_DIGEST_LENGTH];
  SHA256(data, size, sha);
  std::uint64_t out = 0;
  for (int i = 0; i < 8; ++i)
    out = out << 8 | sha[i];
  return out;
}

std::vector<std::uint8_t> encode(const message& m) {
  writer w;
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, hello_msg>) {
          header(w, msg_type::hello);
          w.put(x.seq);
          w.str(x.engine);
          w.put(x.worker);
          w.blob(x.token);
          w.str(x.host.substr(0, max_host_bytes));
          w.blob(x.address);
        } else if constexpr (std::is_same_v<T, plan_msg>) {
          header(w, msg_type::plan);
          w.put(x.seq);
          w.blob(x.plan);
        } else if constexpr (std::is_same_v<T, open_msg>) {
          header(w, msg_type::open);
          w.put(x.seq);
          w.str(x.engine);
          w.put(x.worker);
          w.put(x.tp);
          w.put(x.version);
          w.put(static_cast<std::uint8_t>(x.mode));
          w.put(x.plan);
          w.put(x.prefetch);
          w.put(x.tag_base);
          w.put(x.timeout_ms);
          w.put(static_cast<std::uint8_t>(x.shared));
        } else if constexpr (std::is_same_v<T, get_msg>) {
          header(w, msg_type::get);
          w.put(x.seq);
          w.put(x.session);
          w.put(x.group);
          w.put(x.tag);
          w.put(x.timeout_ms);
        } else if constexpr (std::is_same_v<T, close_msg>) {
          header(w, msg_type::close);
          w.put(x.seq);
          w.put(x.session);
        } else if constexpr (std::is_same_v<T, bye_msg>) {
          header(w, msg_type::bye);
          w.put(x.seq);
        } else if constexpr (std::is_same_v<T, done_msg>) {
          header(w, msg_type::done);
          w.put(x.seq);
          w.put(x.session);
          w.put(x.group);
        } else if constexpr (std::is_same_v<T, ack_msg>) {
          header(w, msg_type::ack);
          w.put(x.seq);
          w.put(static_cast<std::uint8_t>(x.status));
          w.put(x.digest);
          w.str(x.error.substr(0, max_error_bytes));
          put_region(w, x.probe);
          const auto lent = std::min(x.buffers.size(), max_live_buffers);
          w.put(static_cast<std::uint32_t>(lent));
          for (std::size_t i = 0; i < lent; ++i)
            put_region(w, x.buffers[i]);
        } else if constexpr (std::is_same_v<T, manifest_msg>) {
          header(w, msg_type::manifest);
          w.put(x.seq);
          w.put(static_cast<std::uint8_t>(x.status));
          w.str(x.error.substr(0, max_error_bytes));
          w.put(x.session);
          w.put(static_cast<std::uint32_t>(x.groups.size()));
          for (const auto& g : x.groups) {
            w.put(g.group);
            w.put(g.bytes);
            put_specs(w, g.tensors);
            w.put(static_cast<std::uint32_t>(g.offsets.size()));
            for (auto o : g.offsets)
              w.put(o);
          }
          w.put(static_cast<std::uint8_t>(x.shared));
          w.put(static_cast<std::uint8_t>(x.in_place));
          const auto live = std::min(x.live_buffers.size(), max_live_buffers);
          w.put(static_cast<std::uint32_t>(live));
          for (std::size_t i = 0; i < live; ++i)
            w.put(x.live_buffers[i]);
        } else if constexpr (std::is_same_v<T, group_msg>) {
          header(w, msg_type::group);
          w.put(x.seq);
          w.put(static_cast<std::uint8_t>(x.status));
          w.str(x.error.substr(0, max_error_bytes));
          w.put(x.group);
          w.put(x.bytes);
          w.put(x.checksum);
          put_region(w, x.shared);
        } else if constexpr (std::is_same_v<T, reject_msg>) {
          header(w, msg_type::reject);
          w.put(x.seq);
          w.put(static_cast<std::uint8_t>(x.status));
          w.str(x.error.substr(0, max_error_bytes));
        }
      },
      m);
  return w.take();
}

message decode(const std::uint8_t* data, std::size_t size) {
  reader r(data, size, "message");
  if (r.get<std::uint32_t>("magic") != message_magic)
    r.fail("not an rlsync ucx message (bad magic)");
  if (const auto v = r.get<std::uint8_t>("format version"); v != format_version)
    r.fail("format version " + std::to_string(v) + ", expected " + std::to_string(format_version));
  const auto type = r.get<std::uint8_t>("type");
  message out;
  switch (static_cast<msg_type>(type)) {
    case msg_type::hello: {
      r.context("hello");
      hello_msg m;
      m.seq = r.get<std::uint64_t>("seq");
      m.engine = r.str("engine");
      m.worker = r.get<std::int32_t>("worker");
      if (m.worker < 0 || m.worker >= max_tp)
        r.fail("worker " + std::to_string(m.worker) + " out of range");
      m.token = r.blob("token", max_token_bytes);
      m.host = r.str("host", max_host_bytes);
      m.address = r.blob("address", max_worker_address_bytes);
      out = std::move(m);
      break;
    }
    case msg_type::plan: {
      r.context("plan message");
      plan_msg m;
      m.seq = r.get<std::uint64_t>("seq");
      m.plan = r.blob("plan");
      out = std::move(m);
      break;
    }
    case msg_type::open: {
      r.context("open");
      open_msg m;
      m.seq = r.get<std::uint64_t>("seq");
      m.engine = r.str("engine");
      m.worker = r.get<std::int32_t>("worker");
      m.tp = r.get<std::int32_t>("tp");
      m.version = r.get<std::uint64_t>("version");
      const auto mode = r.get<std::uint8_t>("mode");
      if (mode > static_cast<std::uint8_t>(transfer_mode::broadcast))
        r.fail("unknown transfer mode " + std::to_string(mode));
      m.mode = static_cast<transfer_mode>(mode);
      m.plan = r.get<std::uint64_t>("plan digest");
      m.prefetch = r.get<std::uint32_t>("prefetch");
      if (m.prefetch > max_prefetch)
        r.fail("prefetch of " + std::to_string(m.prefetch) + " groups, at most " + std::to_string(max_prefetch));
      m.tag_base = r.get<std::uint64_t>("tag base");
      m.timeout_ms = r.get<std::uint32_t>("timeout");
      m.shared = get_flag(r, "shared");
      if (m.tp < 1 || m.tp > max_tp || m.worker < 0 || m.worker >= m.tp)
        r.fail("worker " + std::to_string(m.worker) + " of tp " + std::to_string(m.tp) + " out of range");
      out = std::move(m);
      break;
    }
    case msg_type::get: {
      r.context("get");
      get_msg m;
      m.seq = r.get<std::uint64_t>("seq");
      m.session = r.get<std::uint64_t>("session");
      m.group = r.get<std::uint32_t>("group");
      m.tag = r.get<std::uint64_t>("tag");
      m.timeout_ms = r.get<std::uint32_t>("timeout");
      out = m;
      break;
    }
    case msg_type::close: {
      r.context("close");
      close_msg m;
      m.seq = r.get<std::uint64_t>("seq");
      m.session = r.get<std::uint64_t>("session");
      out = m;
      break;
    }
    case msg_type::bye: {
      r.context("bye");
      bye_msg m;
      m.seq = r.get<std::uint64_t>("seq");
      out = m;
      break;
    }
    case msg_type::done: {
      r.context("done");
      done_msg m;
      m.seq = r.get<std::uint64_t>("seq");
      m.session = r.get<std::uint64_t>("session");
      m.group = r.get<std::uint32_t>("group");
      out = m;
      break;
    }
    case msg_type::ack: {
      r.context("ack");
      ack_msg m;
      m.seq = r.get<std::uint64_t>("seq");
      m.status = get_status(r);
      m.digest = r.get<std::uint64_t>("digest");
      m.error = r.str("error", max_error_bytes);
      m.probe = get_region(r, "probe");
      m.buffers.resize(r.count<std::uint32_t>("buffer count", max_live_buffers, 4 + 4 + 8 + 8));
      for (auto& b : m.buffers)
        b = get_region(r, "buffer");
      out = std::move(m);
      break;
    }
    case msg_type::manifest: {
      r.context("manifest");
      manifest_msg m;
      m.seq = r.get<std::uint64_t>("seq");
      m.status = get_status(r);
      m.error = r.str("error", max_error_bytes);
      m.session = r.get<std::uint64_t>("session");
      const auto n = r.count<std::uint32_t>("group count", max_groups, 4 + 8 + 4 + 4);
      m.groups.resize(n);
      for (auto& g : m.groups) {
        g.group = r.get<std::uint32_t>("group");
        g.bytes = r.get<std::uint64_t>("group bytes");
        g.tensors = get_specs(r);
        g.offsets.resize(r.count<std::uint32_t>("offset count", max_group_tensors, 8));
        for (auto& o : g.offsets)
          if ((o = r.get<std::uint64_t>("tensor offset")) > max_shared_bytes)
            r.fail("tensor offset " + std::to_string(o) + " beyond any shared buffer");
        if (!g.offsets.empty() && g.offsets.size() != g.tensors.size())
          r.fail("group " + std::to_string(g.group) + ": " + std::to_string(g.offsets.size()) + " offsets for "
                 + std::to_string(g.tensors.size()) + " tensors");
      }
      m.shared = get_flag(r, "shared");
      m.in_place = get_flag(r, "in place");
      if (m.in_place && !m.shared)
        r.fail("groups lent in place in a session that is not shared");
      for (const auto& g : m.groups) {
        if (m.in_place && (g.tensors.empty() || g.offsets.size() != g.tensors.size()))
          r.fail("group " + std::to_string(g.group) + " names no tensors and offsets in a session lent in place");
        if (!m.in_place && !g.offsets.empty())
          r.fail("group " + std::to_string(g.group) + " has tensor offsets in a session not lent in place");
      }
      m.live_buffers.resize(r.count<std::uint32_t>("live buffer count", max_live_buffers, 8));
      for (auto& id : m.live_buffers)
        id = r.get<std::uint64_t>("live buffer");
      out = std::move(m);
      break;
    }
    case msg_type::group: {
      r.context("group header");
      group_msg m;
      m.seq = r.get<std::uint64_t>("seq");
      m.status = get_status(r);
      m.error = r.str("error", max_error_bytes);
      m.group = r.get<std::uint32_t>("group");
      m.bytes = r.get<std::uint64_t>("bytes");
      m.checksum = r.get<std::uint64_t>("checksum");
      m.shared = get_region(r, "shared region");
      out = std::move(m);
      break;
    }
    case msg_type::reject: {
      r.context("reject");
      reject_msg m;
      m.seq = r.get<std::uint64_t>("seq");
      m.status = get_status(r);
      m.error = r.str("error", max_error_bytes);
      out = std::move(m);
      break;
    }
    default:
      r.fail("unknown message type " + std::to_string(type));
  }
  r.done();
  return out;
}

std::uint64_t peek_seq(const std::uint8_t* data, std::size_t size) {
  constexpr std::size_t seq_at = 4 + 1 + 1;
  if (size < seq_at + sizeof(std::uint64_t))
    return 0;
  std::uint32_t magic;
  std::memcpy(&magic, data, sizeof magic);
  if (magic != message_magic || data[4] != format_version)
    return 0;
  std::uint64_t seq;
  std::memcpy(&seq, data + seq_at, sizeof seq);
  return seq;
}

} // namespace rlsync::transfer::ucx_wire
