"""An external trainer rank that publishes a version a second until killed:
version k at second k after EPOCH (seconds since the Unix epoch), so that
ranks started apart still publish the same versions. TinyLlama seeded with
the version, this rank's layers. For the hostile-rank suite.

    publish_loop.py TOPOLOGY RANK EPOCH
"""
import sys
import time

import rlsync
import tiny_llama as tl
import torch

path, rank_index, epoch = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
topology = rlsync.Topology(path)
held = set(tl.names_of_layers(topology.model, topology.ranks[rank_index]["layers"]))
with rlsync.TrainerRank(path, rank=rank_index, verbose=True) as rank:
    while True:
        version = int(time.time() - epoch) + 1
        if version > rank.last_published:
            torch.manual_seed(version)
            state = tl.bf16_state_dict(tl.TinyLlama(topology.model))
            rank.publish(version, {k: v for k, v in state.items() if k in held})
        time.sleep(0.05)
