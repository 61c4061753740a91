#include "runtime/plan/plan.hpp"

namespace rlsync::plan {

std::string op_chain(const std::string& source, const std::vector<std::string>& ops) {
  std::string s = source;
  for (const auto& op : ops)
    s += "." + op;
  return s;
}

std::string plan_entry::describe() const {
  return op_chain(source, ops) + " -> " + param + "[" + std::to_string(dst_offset) + " +" + std::to_string(numel())
         + "]";
}

void replay_into(const plan_entry& e, const void* source, dtype type, void* packed) {
  gather(e.view, source, dtype_size(type), packed);
}

std::vector<std::uint8_t> replay(const plan_entry& e, const void* source, dtype type) {
  std::vector<std::uint8_t> out(static_cast<std::size_t>(e.numel()) * dtype_size(type));
  replay_into(e, source, type, out.data());
  return out;
}

std::uint64_t bytes_per_worker(const worker_plan& p) {
  std::uint64_t n = 0;
  for (const auto& e : p.entries)
    n += e.bytes();
  return n;
}

} // namespace rlsync::plan
