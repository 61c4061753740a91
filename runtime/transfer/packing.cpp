#include "runtime/transfer/packing.hpp"

#include "runtime/base/checksum.hpp"
#include "runtime/plan/groups.hpp"
#include "runtime/plan/strided.hpp"

#include <algorithm>

#include <cstring>
#include <stdexcept>

namespace rlsync::transfer {

namespace {

// The tensor of snapshot `s` that entry `e` of group `g` packs from, checked
// against what the plan recorded.
const tensor_view& source_of(const plan::grouped_plan& p, std::uint32_t g, const weight_snapshot& s,
                             const plan::plan_entry* e) {
    const tensor_view* t = s.find(e->source);
    if (!t)
      throw std::invalid_argument("pack group " + std::to_string(g) + " for worker " + std::to_string(p.worker())
                                  + " of " + std::to_string(p.tp()) + ": version " + std::to_string(s.version())
                                  + " holds no tensor '" + e->source + "'");
    if (t->type != e->source_type || t->shape != e->source_shape)
      throw std::invalid_argument("pack group " + std::to_string(g) + ": tensor '" + e->source + "' is "
                                  + std::string(safetensors_name(t->type)) + " " + shape_string(t->shape)
                                  + ", the plan was recorded for "
                                  + std::string(safetensors_name(e->source_type)) + " "
                                  + shape_string(e->source_shape));
  return *t;
}

} // namespace

void pack_group(const plan::grouped_plan& p, std::uint32_t g, const weight_snapshot& s, std::uint8_t* out) {
  for (const auto* e : p.entries(g)) {
    const tensor_view& t = source_of(p, g, s, e);
    plan::replay_into(*e, t.data, t.type, out);
    out += e->bytes();
  }
}

std::uint64_t pack_group_checksummed(const plan::grouped_plan& p, std::uint32_t g, const weight_snapshot& s,
                                     std::uint8_t* out) {
  checksum64_stream sum;
  for (const auto* e : p.entries(g)) {
    const tensor_view& t = source_of(p, g, s, e);
    const std::size_t es = dtype_size(t.type);
    const auto& v = e->view;
    const std::int64_t n = v.numel();
    if (v.shape.empty() || n == 0 || static_cast<std::uint64_t>(n) * es <= checksum_piece_bytes) {
      plan::gather(v, t.data, es, out);
      sum.update(out, e->bytes());
      out += e->bytes();
      continue;
    }
    // Pieces of whole rows of the first dimension: narrowing it keeps the
    // packed order, so pieces land back to back.
    const std::int64_t rows = v.shape[0];
    const std::uint64_t row_bytes = static_cast<std::uint64_t>(n / rows) * es;
    const std::int64_t step = std::max<std::int64_t>(1, static_cast<std::int64_t>(checksum_piece_bytes / row_bytes));
    for (std::int64_t r = 0; r < rows; r += step) {
      const std::int64_t len = std::min(step, rows - r);
      plan::gather(plan::narrow(v, 0, r, len), t.data, es, out);
      const std::size_t bytes = static_cast<std::size_t>(static_cast<std::uint64_t>(len) * row_bytes);
      sum.update(out, bytes);
      out += bytes;
    }
  }
  return sum.digest();
}

void append_entry_pieces(const plan::plan_entry& e, const std::uint8_t* tensor, std::vector<source_piece>& out) {
  plan::for_each_run(e.view, dtype_size(e.source_type), [&](std::int64_t at, std::size_t bytes) {
    const std::uint8_t* from = tensor + at;
    if (!out.empty() && out.back().at + out.back().bytes == from)
      out.back().bytes += bytes;
    else
      out.push_back({from, bytes});
  });
}

bool lends_in_runs(const plan::grouped_plan& p, std::uint32_t g) {
  return p.shortest_run_bytes(g) >= min_lent_run_bytes;
}

bool lends_in_runs(const plan::grouped_plan& p) {
  return p.shortest_run_bytes() >= min_lent_run_bytes;
}

std::vector<source_piece> group_pieces(const plan::grouped_plan& p, std::uint32_t g, const weight_snapshot& s) {
  std::vector<source_piece> out;
  for (const auto* e : p.entries(g))
    append_entry_pieces(*e, reinterpret_cast<const std::uint8_t*>(source_of(p, g, s, e).data), out);
  return out;
}

std::vector<source_piece> full_group_pieces(const weight_snapshot& s, std::uint32_t g) {
  std::vector<source_piece> out;
  for (const auto& t : s.group(g))
    out.push_back({reinterpret_cast<const std::uint8_t*>(t.data), t.size});
  return out;
}

std::uint64_t largest_full_group_bytes(const weight_source& source) {
  const auto& c = source.config();
  std::vector<std::vector<tensor_view>> groups(plan::group_count(c));
  for (const auto& p : source.parameters()) {
    tensor_view v;
    static_cast<tensor_spec&>(v) = p;
    v.size = static_cast<std::size_t>(p.bytes());
    groups.at(plan::group_of(c, p.name)).push_back(std::move(v));
  }
  std::uint64_t largest = 0;
  for (const auto& g : groups)
    largest = std::max(largest, plan::full_group_layout::of(g).bytes);
  return largest;
}

std::uint64_t checksum_pieces(const std::vector<source_piece>& pieces) {
  // Rows of a kilobyte or two (a row-parallel weight's half rows) are
  // gathered into a scratch window that stays in cache and hashed a window
  // at a time: hashing each alone costs more than reading it.
  constexpr std::size_t small = 16 << 10, window = checksum_piece_bytes;
  thread_local std::vector<std::uint8_t> scratch(window);
  checksum64_stream sum;
  std::size_t held = 0;
  for (const auto& p : pieces) {
    if (p.bytes >= small) {
      sum.update(scratch.data(), held);
      held = 0;
      sum.update(p.at, p.bytes);
      continue;
    }
    if (held + p.bytes > window) {
      sum.update(scratch.data(), held);
      held = 0;
    }
    std::memcpy(scratch.data() + held, p.at, p.bytes);
    held += p.bytes;
  }
  sum.update(scratch.data(), held);
  return sum.digest();
}

void pack_full_group(const std::vector<tensor_view>& tensors, const plan::full_group_layout& layout, std::uint8_t* out) {
  if (tensors.size() != layout.specs.size())
    throw std::invalid_argument("pack full group: layout of " + std::to_string(layout.specs.size()) + " tensors, "
                                + std::to_string(tensors.size()) + " given");
  std::uint64_t end = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].size != layout.specs[i].bytes())
      throw std::invalid_argument("pack full group: tensor '" + tensors[i].name + "' does not fit its layout");
    std::memset(out + end, 0, static_cast<std::size_t>(layout.offsets[i] - end)); // alignment padding
    std::memcpy(out + layout.offsets[i], tensors[i].data, tensors[i].size);
    end = layout.offsets[i] + tensors[i].size;
  }
}

std::uint64_t pack_full_group_checksummed(const std::vector<tensor_view>& tensors,
                                          const plan::full_group_layout& layout, std::uint8_t* out) {
  if (tensors.size() != layout.specs.size())
    throw std::invalid_argument("pack full group: layout of " + std::to_string(layout.specs.size()) + " tensors, "
                                + std::to_string(tensors.size()) + " given");
  checksum64_stream sum;
  std::uint64_t end = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].size != layout.specs[i].bytes())
      throw std::invalid_argument("pack full group: tensor '" + tensors[i].name + "' does not fit its layout");
    std::memset(out + end, 0, static_cast<std::size_t>(layout.offsets[i] - end)); // alignment padding
    sum.update(out + end, static_cast<std::size_t>(layout.offsets[i] - end));
    const auto* src = reinterpret_cast<const std::uint8_t*>(tensors[i].data);
    for (std::uint64_t done = 0; done < tensors[i].size;) {
      const auto piece = static_cast<std::size_t>(std::min<std::uint64_t>(checksum_piece_bytes, tensors[i].size - done));
      std::memcpy(out + layout.offsets[i] + done, src + done, piece);
      sum.update(out + layout.offsets[i] + done, piece);
      done += piece;
    }
    end = layout.offsets[i] + tensors[i].size;
  }
  if (layout.bytes > end) { // trailing padding, if the layout has any
    std::memset(out + end, 0, static_cast<std::size_t>(layout.bytes - end));
    sum.update(out + end, static_cast<std::size_t>(layout.bytes - end));
  }
  return sum.digest();
}

} // namespace rlsync::transfer
