"""Expert parallelism on both sides, from PyTorch: a Qwen3-MoE whose experts
are split over two trainer ranks in two Python processes (each holds every
layer's dense tensors and routers, rank 0 experts 0-3, rank 1 experts 4-7,
as trainer.ranks[].experts says), pulled by engines that place whole experts
over their two workers (engines[].expert_parallel). Each round pulls every
expert from the rank holding it; the fleet's greedy completions equal
TinyLlama's on the whole model, token for token. Both processes train the
same model from the same seed (deterministic on CPU).

    test_moe_ranks.py RLSYNC_BINARY BUILD_DIR
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster  # noqa: E402

cluster.require_torch()
rlsync_bin, build_dir = sys.argv[1], sys.argv[2]
cluster.import_rlsync(build_dir)

moe = dict(arch="qwen3_moe", experts=8, experts_per_tok=2, moe_intermediate_size=32, mlp_only_layers="[0]")
with cluster.Cluster(rlsync_bin, ranks=["all/0-3", "all/4-7"], engines=2, tp=2, model=moe,
                     engine_keys=", expert_parallel: true") as c:
    # No --layers: each rank publishes what the topology says it holds.
    cluster.run_example_ranks(c, build_dir, [[], []], steps=3)
print("PASS")
