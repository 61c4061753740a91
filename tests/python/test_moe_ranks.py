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
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster  # noqa: E402

cluster.require_torch()
rlsync_bin, build_dir = sys.argv[1], sys.argv[2]
cluster.import_rlsync(build_dir)

moe = dict(arch="qwen3_moe", experts=8, experts_per_tok=2, moe_intermediate_size=32, mlp_only_layers="[0]")
with cluster.Cluster(rlsync_bin, ranks=["all/0-3", "all/4-7"], engines=2, tp=2, model=moe,
                     engine_keys=", expert_parallel: true") as c:
    example = os.path.join(cluster.EXAMPLES, "train_and_sync.py")
    # No --layers: each rank publishes what the topology says it holds.
    common = [sys.executable, example, "--topology", c.topology, "--steps", "3", "--timeout-s", "90"]
    env = cluster.python_env(build_dir)
    env["OMP_NUM_THREADS"] = "1"  # two trainers on two cores; one thread each trains identically
    ranks = [subprocess.Popen(common + ["--rank", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=env),
             subprocess.Popen(common + ["--rank", "1", "--no-rollouts"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=env)]
    outputs = []
    for p in ranks:
        try:
            out, _ = p.communicate(timeout=400)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        outputs.append(out)
    for i, (p, out) in enumerate(zip(ranks, outputs)):
        print(f"---- rank {i} ----\n{out}")
    for i, p in enumerate(ranks):
        if p.returncode != 0 or "PASS: all 4 greedy completions equal TinyLlama's" not in outputs[i]:
            c.dump()
            cluster.fail(f"rank {i} exited {p.returncode}")
    if '"rank": 1' not in outputs[0]:
        cluster.fail("the fleet status does not list rank 1")
print("PASS")
