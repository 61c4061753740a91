"""Two trainer ranks from two Python processes, each holding half the
layers (rank 0: layers 0-1 with the embeddings, rank 1: layers 2-3 with the
head): every round pulls each half from its own rank, and the fleet's greedy
completions equal TinyLlama's on the whole model, token for token. Both
processes train the same model from the same seed (deterministic on CPU).

    test_two_ranks.py RLSYNC_BINARY BUILD_DIR
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster  # noqa: E402

cluster.require_torch()
rlsync_bin, build_dir = sys.argv[1], sys.argv[2]
cluster.import_rlsync(build_dir)

with cluster.Cluster(rlsync_bin, ranks=["0-1", "2-3"], engines=2) as c:
    cluster.run_example_ranks(c, build_dir, [["--layers", "0-1"], ["--layers", "2-3"]], steps=12)
print("PASS")
