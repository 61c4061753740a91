#pragma once
// A consumer's sharding plan as a producer takes it in: the ucx producer's
// plan message and the trainer's nccl_plan_atom both hand over a plan that a
// peer encoded (ucx_wire's plan encoding), and both pack whatever it says.
// So before anything is packed: the bytes decode under the wire's limits,
// every entry reads inside its source, every entry names a parameter of the
// model in its shape (so that no made-up tensor can make a size wrap),
// entries for tensors this producer holds match them in dtype too (entries
// for other tensors are another rank's), and no group packs more than 4x
// its full bytes (a plan repeating entries must not make a producer pack
// without bound).
#include "runtime/plan/grouped_plan.hpp"
#include "runtime/transfer/weight_source.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace rlsync::transfer {

class plan_intake {
public:
  /// What a plan must fit: `source`'s model and the parameters it holds.
  explicit plan_intake(const weight_source& source);

  /// Why a plan was refused: malformed bytes, or a plan that does not fit.
  struct refusal : std::invalid_argument {
    refusal(bool malformed, const std::string& why) : std::invalid_argument(why), malformed(malformed) {}
    bool malformed;
  };

  /// The plan encoded in `size` bytes at `data`, grouped; throws refusal
  /// ("malformed plan: …" or "the plan does not fit this producer's model: …").
  std::shared_ptr<const plan::grouped_plan> accept(const std::uint8_t* data, std::size_t size) const;

private:
  void check_against_model(const plan::worker_plan& p) const;

  model_config config_;
  std::map<std::string, tensor_spec> params_by_name_;       ///< held
  std::map<std::string, std::vector<std::int64_t>> model_shapes_; ///< every parameter of the model
  std::vector<std::uint64_t> full_group_bytes_; ///< of each model group this producer holds (0 for others)
};

} // namespace rlsync::transfer
