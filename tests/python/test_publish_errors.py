"""rlsync.Topology and rlsync.TrainerRank refuse what they cannot use with a
clear error naming the place (file:line:col, the tensor), and lose nothing:
after every refusal the rank still publishes, and the fleet serves it.

    test_publish_errors.py RLSYNC_BINARY BUILD_DIR
"""
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster  # noqa: E402

cluster.require_torch()
rlsync_bin, build_dir = sys.argv[1], sys.argv[2]
rlsync = cluster.import_rlsync(build_dir)
import torch  # noqa: E402
import tiny_llama as tl  # noqa: E402


def expect(error_type, needle, call):
    try:
        call()
    except error_type as e:
        if needle not in str(e):
            cluster.fail(f"{error_type.__name__} without {needle!r}: {e}")
        print(f"ok: {error_type.__name__}: {str(e).splitlines()[0]}")
        return
    except Exception as e:  # noqa: BLE001
        cluster.fail(f"expected {error_type.__name__} with {needle!r}, got {type(e).__name__}: {e}")
    cluster.fail(f"expected {error_type.__name__} with {needle!r}, nothing raised")


with cluster.Cluster(rlsync_bin, ranks=["0-1", "2-3"]) as c:
    # Topology: the same file:line:col errors as `rlsync validate`.
    bad = os.path.join(c.dir, "bad.yaml")
    with open(bad, "w") as f:
        f.write(open(c.topology).read().replace("source: external", "source: outside"))
    expect(ValueError, "bad.yaml:", lambda: rlsync.Topology(bad))
    expect(ValueError, "trainer.source: must be one of synthetic, checkpoint_dir, external, got 'outside'",
           lambda: rlsync.Topology(bad))
    t = rlsync.Topology(c.topology)
    assert t.source == "external" and t.dtype == "BF16", (t.source, t.dtype)
    assert t.router_url == c.url, t.router_url
    assert [r["layers"] for r in t.ranks] == [[0, 1], [2, 3]], t.ranks
    # A rank the topology lacks, and a topology whose ranks are not external.
    expect(ValueError, "no trainer rank 7", lambda: rlsync.TrainerRank(t, rank=7))
    synthetic = os.path.join(c.dir, "synthetic.yaml")
    with open(synthetic, "w") as f:
        f.write(open(c.topology).read().replace("source: external", "source: synthetic"))
    expect(ValueError, "not external", lambda: rlsync.TrainerRank(synthetic, rank=0))
    # A wrong secret is refused by the gatekeeper, as for any node.
    wrong = os.path.join(c.dir, "wrong.secret")
    with open(wrong, "w") as f:
        f.write("not-the-secret\n")
    os.chmod(wrong, 0o600)
    expect(RuntimeError, "refused to admit", lambda: rlsync.TrainerRank(t, rank=0, secret_file=wrong))

    torch.manual_seed(1)
    model = tl.TinyLlama(t.model)
    full = tl.bf16_state_dict(model)
    mine = {k: v for k, v in full.items() if k in set(tl.names_of_layers(t.model, [0, 1]))}
    with rlsync.TrainerRank(t, rank=0) as rank:
        assert rank.node == "trainer" and rank.dtype == "BF16"
        name = "model.layers.0.mlp.up_proj.weight"
        cases = [
            (ValueError, "layer 2 is not held by trainer rank 0 (it holds layers 0-1)", full),
            (ValueError, "missing tensor 'model.layers.1.mlp.down_proj.weight'",
             {k: v for k, v in mine.items() if k != "model.layers.1.mlp.down_proj.weight"}),
            (ValueError, f"tensor '{name}': shape [128, 65]",
             dict(mine, **{name: torch.zeros(128, 65, dtype=torch.bfloat16)})),
            (ValueError, f"tensor '{name}': dtype F32, the topology's weights are BF16",
             dict(mine, **{name: mine[name].float()})),
            (ValueError, f"tensor '{name}': unsupported dtype torch.int64",
             dict(mine, **{name: torch.zeros(128, 64, dtype=torch.int64)})),
            (ValueError, f"tensor '{name}' is not contiguous",
             dict(mine, **{name: torch.zeros(64, 128, dtype=torch.bfloat16).t()})),
            (ValueError, f"tensor '{name}' is on meta",
             dict(mine, **{name: torch.empty(128, 64, dtype=torch.bfloat16, device="meta")})),
            (ValueError, "model.layers.0.input_layernorm.weight' element 3 is NaN",
             dict(mine, **{"model.layers.0.input_layernorm.weight":
                           torch.tensor([1.0, 1, 1, float("nan")] + [1.0] * 60, dtype=torch.bfloat16)})),
            (ValueError, "tensor 'model.layers.0.mlp.bias': not a parameter",
             dict(mine, **{"model.layers.0.mlp.bias": torch.zeros(4, dtype=torch.bfloat16)})),
            (TypeError, f"tensor '{name}': expected a torch.Tensor, got list", dict(mine, **{name: [1, 2]})),
            (TypeError, "expected a mapping", [1, 2]),
        ]
        for error_type, needle, state in cases:
            expect(error_type, needle, lambda: rank.publish(1, state))
        # Tensors on a device other than the CPU or CUDA say what is accepted.
        expect(ValueError, "only CPU and CUDA tensors can be published",
               lambda: rank.publish(1, dict(mine, **{name: torch.empty(128, 64, dtype=torch.bfloat16,
                                                                        device="meta")})))
        # A CUDA tensor on a machine without CUDA: a CUDA build waits for its
        # device to finish writing it, which fails naming the tensor and the
        # device; a build without CUDA has PyTorch copy it to the host (below).

        class OnCuda:
            def __init__(self, t):
                self.t, self.device, self.dtype, self.shape, self.layout = (
                    t, torch.device("cuda:0"), t.dtype, t.shape, t.layout)

            def __getattr__(self, attr):
                return getattr(self.t, attr)

        if not torch.cuda.is_available() and rank.reads_cuda_tensors:
            expect(RuntimeError, f"tensor '{name}': waiting for cuda:0 to finish writing it failed",
                   lambda: rank.publish(1, dict(mine, **{name: OnCuda(mine[name])})))
        assert rank.last_published == 0, rank.last_published
        # Nothing above was kept: version 1 is still free.
        rank.publish(1, mine if rank.reads_cuda_tensors else dict(mine, **{name: OnCuda(mine[name])}))
        expect(ValueError, "version 1: must exceed the last version published (1)", lambda: rank.publish(1, mine))
        status = rank.status()
        assert status["rank"] == 0 and status["last_published"] == 1, status
        assert set(status["engines"]) == {"rollout-0", "rollout-1"}, status
        # Rank 1 never joined: no round can run, and wait_synced says where the fleet is.
        expect(TimeoutError, "not served by every live engine within", lambda: rank.wait_synced(1, timeout_s=0.5))
        expect(ValueError, "timeout_s must be in", lambda: rank.wait_synced(1, timeout_s=-1))
    expect(RuntimeError, "closed", lambda: rank.publish(2, mine))
    assert rank.closed
    # The same rank opened again in this process (a training loop that
    # recovered from an error): a new incarnation, above the cluster's versions.
    with rlsync.TrainerRank(t, rank=0) as again:
        again.publish(2, mine)  # rank 1 never joined: no round ran, nothing is served yet
        assert again.status()["last_published"] == 2
    print("ok: a rank reopened in the same process publishes on")

    # close() from another thread while publish runs: the publish finishes or
    # is refused as closed; the system is never pulled from under it.
    theirs = {k: v for k, v in full.items() if k in set(tl.names_of_layers(t.model, [2, 3]))}
    other = rlsync.TrainerRank(t, rank=1)
    outcome = []

    def publish_until_closed():
        version = 3  # above what rank 0 published before this rank joined
        while True:
            try:
                other.publish(version, theirs)
            except Exception as e:  # noqa: BLE001
                outcome.append(f"{type(e).__name__}: {e}")
                return
            version += 1

    worker = threading.Thread(target=publish_until_closed)
    worker.start()
    time.sleep(0.3)
    other.close()
    worker.join(timeout=60)
    assert not worker.is_alive(), "publish still running 60 s after close()"
    assert outcome and outcome[0].startswith("RuntimeError") and "closed" in outcome[0], outcome
    print(f"ok: close() while publishing: {outcome[0]}")
print("PASS")
