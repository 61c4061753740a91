"""One external trainer rank in its own process, driven line by line on
stdin by a test (each answered on stdout with "ok ..." or "error ..."):

    publish V          version V: TinyLlama seeded with V, bf16, this rank's layers
    withhold V S       the drill hook: withhold the first group of V for S seconds
    wait V S           wait_synced(V, timeout_s=S)
    status             rank.status() as JSON

    rank_worker.py TOPOLOGY RANK
"""
import json
import sys

import rlsync
import tiny_llama as tl
import torch


def weights(config, version):
    """Every process computes the same weights for a version."""
    torch.manual_seed(version)
    return tl.bf16_state_dict(tl.TinyLlama(config))


def main():
    path, rank_index = sys.argv[1], int(sys.argv[2])
    topology = rlsync.Topology(path)
    layers = topology.ranks[rank_index]["layers"]
    held = set(tl.names_of_layers(topology.model, layers))
    with rlsync.TrainerRank(path, rank=rank_index) as rank:
        print(f"ok joined rank {rank_index} layers {layers}", flush=True)
        for line in sys.stdin:
            words = line.split()
            try:
                if words[0] == "publish":
                    state = weights(topology.model, int(words[1]))
                    rank.publish(int(words[1]), {k: v for k, v in state.items() if k in held})
                    print(f"ok published {words[1]}", flush=True)
                elif words[0] == "withhold":
                    print("ok " + "; ".join(rank._drill_withhold(int(words[1]), float(words[2]))), flush=True)
                elif words[0] == "wait":
                    rank.wait_synced(int(words[1]), timeout_s=float(words[2]))
                    print(f"ok synced {words[1]}", flush=True)
                elif words[0] == "status":
                    print("ok " + json.dumps(rank.status()), flush=True)
                else:
                    print(f"error unknown command {words[0]}", flush=True)
            except Exception as e:  # noqa: BLE001  (the test reads why)
                print(f"error {type(e).__name__}: {e}".replace("\n", " | "), flush=True)


if __name__ == "__main__":
    main()
