#include "runtime/engine/kv_cache.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace rlsync::engine {

namespace {
std::int64_t local_kv_heads(const model_config& c, int tp) {
  return c.num_key_value_heads >= tp ? c.num_key_value_heads / tp : 1;
}
} // namespace

kv_sequence::kv_sequence(const model_config& c, int tp)
    : tp_(tp), layers_(c.num_hidden_layers), row_(local_kv_heads(c, tp) * c.head_dim()),
      k_(static_cast<std::size_t>(tp * c.num_hidden_layers)), v_(k_.size()) {}

bool kv_sequence::compatible(const model_config& c, int tp) const {
  return tp_ == tp && layers_ == c.num_hidden_layers && row_ == local_kv_heads(c, tp) * c.head_dim();
}

void kv_sequence::truncate(std::int64_t n) {
  if (n < 0 || n > length_)
    throw std::out_of_range("kv_sequence: cannot truncate " + std::to_string(length_) + " positions to "
                            + std::to_string(n));
  length_ = n;
}

void kv_sequence::clear() {
  length_ = 0;
  for (auto* side : {&k_, &v_})
    for (auto& layer : *side) {
      layer.clear();
      layer.shrink_to_fit();
    }
}

void kv_sequence::copy_prefix(const kv_sequence& from, std::int64_t n) {
  if (from.tp_ != tp_ || from.layers_ != layers_ || from.row_ != row_)
    throw std::invalid_argument("kv_sequence: copy_prefix between differently shaped caches");
  if (n < 0 || n > from.length_)
    throw std::out_of_range("kv_sequence: cannot copy " + std::to_string(n) + " positions of "
                            + std::to_string(from.length_));
  const auto count = static_cast<std::size_t>(n * row_);
  for (std::size_t i = 0; i < k_.size(); ++i) {
    k_[i].assign(from.k_[i].begin(), from.k_[i].begin() + static_cast<std::ptrdiff_t>(count));
    v_[i].assign(from.v_[i].begin(), from.v_[i].begin() + static_cast<std::ptrdiff_t>(count));
  }
  length_ = n;
}

kv_sequence kv_sequence::prefix(std::int64_t n) const {
  kv_sequence out;
  out.tp_ = tp_;
  out.layers_ = layers_;
  out.row_ = row_;
  out.k_.resize(k_.size());
  out.v_.resize(v_.size());
  out.copy_prefix(*this, n);
  return out;
}

std::uint64_t kv_sequence::bytes() const {
  std::uint64_t n = 0;
  for (std::size_t i = 0; i < k_.size(); ++i)
    n += (k_[i].capacity() + v_[i].capacity()) * sizeof(float);
  return n;
}

void kv_sequence::reserve(int w, std::int64_t positions) {
  const auto need = static_cast<std::size_t>(positions * row_);
  for (std::int64_t l = 0; l < layers_; ++l) {
    auto s = slot(w, l);
    if (k_[s].size() < need) {
      // resize grows capacity geometrically, so appending one token at a
      // time costs amortised O(1) copies.
      k_[s].resize(need);
      v_[s].resize(need);
    }
  }
}

} // namespace rlsync::engine
