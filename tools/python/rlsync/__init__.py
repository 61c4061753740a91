"""rlsync from Python: a PyTorch trainer publishes its weights to a fleet of
rollout engines, which receive them in rlsync's sync rounds.

    import rlsync
    with rlsync.TrainerRank("topology.yaml", rank=0) as rank:  # joins as trainer rank 0
        for step in range(1, steps + 1):
            train_one_step(model)
            rank.publish(step, model.state_dict())   # copies; never waits for a round
        rank.wait_synced(steps, timeout_s=60.0)      # every live engine serves >= steps
        print(rank.status()["engines"])

The topology's trainer says `source: external`; its coordinator's node runs
under `rlsync node` (or `rlsync launch`). Topology(path) validates a file
with the same file:line:col errors as `rlsync validate` (ValueError).
"""
from ._rlsync import Topology, TrainerRank

__all__ = ["Topology", "TrainerRank"]
