"""The example training loop end to end: TinyLlama trains with Adam on
synthetic tokens and publishes every step as external trainer rank 0; the
head's two built-in engines serve rollouts while it trains; at the end the
fleet's greedy completions (weights received only through publish -> sync)
equal TinyLlama's own greedy decode, token for token.

    test_example.py RLSYNC_BINARY BUILD_DIR
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster  # noqa: E402

cluster.require_torch()
rlsync_bin, build_dir = sys.argv[1], sys.argv[2]
cluster.import_rlsync(build_dir)

with cluster.Cluster(rlsync_bin, ranks=["0-3"], engines=2, tp=2) as c:
    example = os.path.join(cluster.EXAMPLES, "train_and_sync.py")
    p = subprocess.run([sys.executable, example, "--topology", c.topology, "--steps", "30", "--lr", "0.03", "--timeout-s", "60"],
                       capture_output=True, text=True, timeout=400, env=cluster.python_env(build_dir))
    print(p.stdout)
    print(p.stderr)
    if p.returncode != 0:
        c.dump()
        cluster.fail(f"the example exited {p.returncode}")
    for needle in ("PASS: all 4 greedy completions equal TinyLlama's", "rollouts served while training: "):
        if needle not in p.stdout:
            cluster.fail(f"the example's output lacks {needle!r}")
    if "rollouts served while training: 0 completions" in p.stdout:
        cluster.fail("no rollout was served while training")
print("PASS")
