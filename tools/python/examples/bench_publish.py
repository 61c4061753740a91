"""Benchmarks of the rlsync Python module (figures printed, nothing asserted).

  publish   TrainerRank.publish of a ~1 GB bf16 model: seconds and GB/s per
            publish, and the process's resident memory after each (the copy
            a version owns is the only extra: one model's bytes per version
            kept, two by default plus a pinned one).
  step      trainer step -> every engine serving that version, for a ~256 MB
            model over UCX with two engines: publish + wait_synced, next to
            what a checkpoint_dir trainer pays before the same sync can start
            (write the safetensors step directory, then read it back).

    PYTHONPATH=build/python:tools/python/examples:tests/python \\
      python3 tools/python/examples/bench_publish.py build/tools/rlsync [publish|step]
"""
import os
import shutil
import statistics
import sys
import tempfile
import time

import cluster
import tiny_llama as tl
import torch


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def bench_publish(rlsync_bin):
    import rlsync
    model = dict(layers=8, hidden_size=2048, heads=16, kv_heads=16, intermediate_size=5632, vocab_size=32000)
    # No round runs while it measures (every_versions far above the versions published).
    with cluster.Cluster(rlsync_bin, ranks=["0-7"], engines=1, model=model, every_versions=1000) as c:
        t = rlsync.Topology(c.topology)
        torch.manual_seed(0)
        module = tl.TinyLlama(t.model)
        state = tl.bf16_state_dict(module)
        del module
        total = sum(v.numel() * v.element_size() for v in state.values())
        print(f"publish: model {total / 1e9:.3f} GB bf16, {len(state)} tensors")
        with rlsync.TrainerRank(t, rank=0) as rank:
            times = []
            base = rss_bytes()
            for v in range(1, 11):
                t0 = time.perf_counter()
                rank.publish(v, state)
                dt = time.perf_counter() - t0
                times.append(dt)
                time.sleep(0.2)  # the trainer's step publishes it and drops the oldest
                print(f"  v{v}: {dt * 1e3:7.1f} ms, {total / dt / 1e9:5.2f} GB/s, resident +{(rss_bytes() - base) / total:.2f} models")
            steady = times[5:]  # from the fifth on, each copy lands in a dropped version's buffer
            print(f"publish: {statistics.median(steady) * 1e3:.1f} ms median of v6-v10 "
                  f"({total / statistics.median(steady) / 1e9:.2f} GB/s; goal >= 5 GB/s); the first four into fresh "
                  f"memory: {statistics.median(times[:4]) * 1e3:.0f} ms median (page faults); resident settles at "
                  f"+{(rss_bytes() - base) / total:.2f} models (two versions kept, two spare buffers)")


def bench_step(rlsync_bin):
    import rlsync
    model = dict(layers=8, hidden_size=1024, heads=16, kv_heads=8, intermediate_size=2816, vocab_size=32000)
    with cluster.Cluster(rlsync_bin, ranks=["0-7"], engines=2, backend="ucx", model=model) as c:
        t = rlsync.Topology(c.topology)
        torch.manual_seed(0)
        module = tl.TinyLlama(t.model)
        total = sum(p.numel() * 2 for p in module.state_dict().values())
        print(f"step: model {total / 1e6:.0f} MB bf16, 2 engines, transfer.backend ucx")
        rows = []
        with rlsync.TrainerRank(t, rank=0) as rank:
            for v in range(1, 6):
                with torch.no_grad():
                    for p in module.parameters():
                        p.add_(1e-3)
                state = tl.bf16_state_dict(module)
                t0 = time.perf_counter()
                rank.publish(v, state)
                t1 = time.perf_counter()
                rank.wait_synced(v, timeout_s=120)
                t2 = time.perf_counter()
                rows.append((t1 - t0, t2 - t0))
                print(f"  v{v}: publish {(t1 - t0) * 1e3:6.1f} ms, served everywhere {(t2 - t0) * 1e3:7.1f} ms after the step")
            scratch = tempfile.mkdtemp(prefix="rlsync-bench-")
            writes, reads = [], []
            try:
                for v in range(1, 4):
                    d = os.path.join(scratch, f"step-{v:06d}")
                    t0 = time.perf_counter()
                    tl.write_checkpoint(d, state, t.model)
                    os.sync()
                    t1 = time.perf_counter()
                    for name in os.listdir(d):
                        with open(os.path.join(d, name), "rb") as f:
                            while f.read(64 << 20):
                                pass
                    t2 = time.perf_counter()
                    writes.append(t1 - t0)
                    reads.append(t2 - t1)
            finally:
                shutil.rmtree(scratch)
        warm = rows[1:]
        direct = statistics.median(r[1] for r in warm)
        sync_only = statistics.median(r[1] - r[0] for r in warm)
        ckpt = statistics.median(writes) + statistics.median(reads) + sync_only
        print(f"step: publish -> served {direct * 1e3:.0f} ms (median of warm steps; publish "
              f"{statistics.median(r[0] for r in warm) * 1e3:.0f} ms of it)")
        print(f"step: checkpoint_dir -> served >= {ckpt * 1e3:.0f} ms (write {statistics.median(writes) * 1e3:.0f} ms "
              f"+ read {statistics.median(reads) * 1e3:.0f} ms + the same sync {sync_only * 1e3:.0f} ms; its "
              f"step_time_ms poll not counted)")
        print(f"step: {ckpt / direct:.1f}x faster than checkpoint_dir (goal >= 5x)")


if __name__ == "__main__":
    what = sys.argv[2] if len(sys.argv) > 2 else "both"
    if what in ("publish", "both"):
        bench_publish(sys.argv[1])
    if what in ("step", "both"):
        bench_step(sys.argv[1])
