// Packing with the checksum folded in: the same bytes as pack_group /
// pack_full_group and the checksum of those bytes, on a model whose
// tensors span many checksum pieces (row-split, column-split and
// replicated entries alike), for every worker of several tp sizes.
#include "runtime/base/checksum.hpp"
#include "runtime/engine/recording.hpp"
#include "runtime/transfer/packing.hpp"

#include "tests/support/transfer_fixtures.hpp"

#include <doctest/doctest.h>

#include <limits>
#include <vector>

using namespace rlsync;
using namespace rlsync::transfer;

TEST_CASE("packing: the checksum folded into packing equals packing, then hashing") {
  model_config c = test::small_model(2);
  c.hidden_size = 512; // the embeddings and the MLP span several pieces of checksum_piece_bytes
  c.intermediate_size = 1408;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.vocab_size = 4099; // rows that do not divide a piece evenly
  auto src = test::small_source(c);
  auto s = src->produce_next();
  std::uint64_t largest_entry = 0;
  for (int tp : {1, 2, 4}) {
    for (int w = 0; w < tp; ++w) {
      CAPTURE(tp);
      CAPTURE(w);
      plan::grouped_plan p(c, std::make_shared<const plan::worker_plan>(engine::make_plan(c, tp, w, dtype::bf16)));
      for (const auto& e : p.plan().entries)
        largest_entry = std::max(largest_entry, e.bytes());
      for (auto g : s->groups()) {
        CAPTURE(g);
        std::vector<std::uint8_t> two(p.bytes(g), 0), one(p.bytes(g), 0xee);
        pack_group(p, g, *s, two.data());
        const std::uint64_t sum = pack_group_checksummed(p, g, *s, one.data());
        CHECK(one == two);
        CHECK(sum == checksum64(two.data(), two.size()));
        // Lent in place: the pieces back to back are the packed bytes, and
        // their read-only checksum is packing's.
        const auto pieces = group_pieces(p, g, *s);
        std::vector<std::uint8_t> gathered;
        for (const auto& piece : pieces)
          gathered.insert(gathered.end(), piece.at, piece.at + piece.bytes);
        CHECK(gathered == two);
        CHECK(checksum_pieces(pieces) == sum);
        for (std::size_t i = 1; i < pieces.size(); ++i) // runs that continue one another are one piece
          CHECK(pieces[i - 1].at + pieces[i - 1].bytes != pieces[i].at);
      }
    }
  }
  CHECK(largest_entry > 4 * checksum_piece_bytes); // the piece-by-piece path ran
  for (auto g : s->groups()) {
    const auto& tensors = s->group(g);
    const auto layout = plan::full_group_layout::of(tensors);
    std::vector<std::uint8_t> two(layout.bytes, 0), one(layout.bytes, 0xee);
    pack_full_group(tensors, layout, two.data());
    const std::uint64_t sum = pack_full_group_checksummed(tensors, layout, one.data());
    CHECK(one == two);
    CHECK(sum == checksum64(two.data(), two.size()));
    // In place, broadcast: the tensors whole, back to back, no padding.
    std::vector<std::uint8_t> whole;
    for (const auto& t : tensors)
      whole.insert(whole.end(), reinterpret_cast<const std::uint8_t*>(t.data),
                   reinterpret_cast<const std::uint8_t*>(t.data) + t.size);
    CHECK(checksum_pieces(full_group_pieces(*s, g)) == checksum64(whole.data(), whole.size()));
  }
}

TEST_CASE("a group lends in runs unless one of its entries reads runs shorter than min_lent_run_bytes") {
  // small_model's o_proj is [64, 64] bf16: a worker of tp keeps 64 / tp
  // columns of each row, runs of 128 / tp bytes; everything else is whole
  // rows. The fused experts' slices are transposed: a run per element.
  struct row {
    const char* what;
    model_config config;
    int tp;
    std::uint64_t shortest_run; // bytes
    bool lends;
  };
  model_config fused = test::small_model(2);
  fused.arch = model_arch::qwen3_moe;
  fused.fused_experts = true;
  fused.num_experts = 4;
  fused.num_experts_per_tok = 2;
  fused.moe_intermediate_size = 32;
  const row rows[] = {
      {"tp 1: whole tensors, the norms' 64 bf16", test::small_model(2), 1, 128, true},
      {"tp 2: o_proj's half rows of 64 bytes", test::small_model(2), 2, 64, true},
      {"tp 4: o_proj's quarter rows of 32 bytes", test::small_model(2), 4, 32, false},
      {"fused experts, tp 2: transposed slices, one element a run", fused, 2, 2, false},
  };
  for (const auto& r : rows) {
    CAPTURE(r.what);
    plan::grouped_plan p(r.config, std::make_shared<const plan::worker_plan>(engine::make_plan(r.config, r.tp, 0,
                                                                                               dtype::bf16)));
    bool all = true;
    for (std::uint32_t g = 0; g < p.group_count(); ++g)
      all = all && lends_in_runs(p, g);
    CHECK(all == r.lends);
    CHECK(lends_in_runs(p) == r.lends);
    CHECK(p.shortest_run_bytes() == r.shortest_run);
    CHECK(p.shortest_run_bytes(p.group_count()) == std::numeric_limits<std::uint64_t>::max()); // no such group
  }
}
