"""Two trainer ranks from two Python processes, each holding half the
layers (rank 0: layers 0-1 with the embeddings, rank 1: layers 2-3 with the
head): every round pulls each half from its own rank, and the fleet's greedy
completions equal TinyLlama's on the whole model, token for token. Both
processes train the same model from the same seed (deterministic on CPU).

    test_two_ranks.py RLSYNC_BINARY BUILD_DIR
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster  # noqa: E402

cluster.require_torch()
rlsync_bin, build_dir = sys.argv[1], sys.argv[2]
cluster.import_rlsync(build_dir)

with cluster.Cluster(rlsync_bin, ranks=["0-1", "2-3"], engines=2) as c:
    example = os.path.join(cluster.EXAMPLES, "train_and_sync.py")
    common = [sys.executable, example, "--topology", c.topology, "--steps", "12", "--timeout-s", "90"]
    env = cluster.python_env(build_dir)
    env["OMP_NUM_THREADS"] = "1"  # two trainers on two cores; one thread each trains identically
    ranks = [subprocess.Popen(common + ["--rank", "0", "--layers", "0-1"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=env),
             subprocess.Popen(common + ["--rank", "1", "--layers", "2-3", "--no-rollouts"], stdout=subprocess.PIPE,
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
    # Every round pulled from both ranks: the status of the last one names them.
    if '"rank": 1' not in outputs[0]:
        cluster.fail("the fleet status does not list rank 1")
print("PASS")
