"""A Python trainer rank killed with SIGKILL mid-transfer: the round aborts,
no engine serves a mix of versions, and a new process for that rank takes
over (a new incarnation): a version number the fleet already serves is refused,
and the fleet syncs the next version.

Rank 0 withholds a group of version 2 (the drill hook `rlsync drill` uses on
node processes), so the kill lands while engines wait for it.

    test_rank_killed.py RLSYNC_BINARY BUILD_DIR
"""
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster  # noqa: E402

cluster.require_torch()
rlsync_bin, build_dir = sys.argv[1], sys.argv[2]
cluster.import_rlsync(build_dir)
import rlsync  # noqa: E402
import tiny_llama as tl  # noqa: E402
import torch  # noqa: E402


class Worker:
    """rank_worker.py in its own process; ask() sends a command and returns its answer."""

    def __init__(self, topology, rank):
        self.p = subprocess.Popen([sys.executable, os.path.join(cluster.HERE, "rank_worker.py"), topology, str(rank)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  env=cluster.python_env(build_dir))
        self.lines = queue.Queue()
        threading.Thread(target=lambda: [self.lines.put(l.rstrip("\n")) for l in self.p.stdout], daemon=True).start()
        self.expect("ok joined", 40)

    def expect(self, prefix, timeout_s):
        while True:
            try:
                line = self.lines.get(timeout=timeout_s)
            except queue.Empty:
                cluster.fail(f"no answer starting {prefix!r} from the worker within {timeout_s} s")
            print("worker:", line)
            if line.startswith("ok") or line.startswith("error"):
                if not line.startswith(prefix):
                    cluster.fail(f"worker answered {line!r}, expected {prefix!r}")
                return line

    def ask(self, command, prefix="ok", timeout_s=60):
        self.p.stdin.write(command + "\n")
        self.p.stdin.flush()
        return self.expect(prefix, timeout_s)


with cluster.Cluster(rlsync_bin, ranks=["0-1", "2-3"], engines=2, drill_events=True, backend="ucx") as c:
    a, b = Worker(c.topology, 0), Worker(c.topology, 1)
    a.ask("publish 1"), b.ask("publish 1")
    a.ask("wait 1 60", "ok synced 1")
    a.ask("withhold 2 60", "ok trainer rank 0 withholds group")
    mark = len(c.lines)
    a.ask("publish 2"), b.ask("publish 2")
    c.wait_for(r"version=2 phase=transfer", 30, "the transfer of version 2", mark)
    a.p.send_signal(signal.SIGKILL)
    a.p.wait(10)
    # The round fails (the rank is gone); no engine serves a partial update.
    for _ in range(200):
        status = json.loads(b.ask("status")[3:])
        if status["last_round"] and status["last_round"]["version"] == 2:
            break
        time.sleep(0.05)
    if not status["last_round"]["aborted"]:
        cluster.fail(f"the round of version 2 was not aborted: {status['last_round']}")
    for name, e in status["engines"].items():
        if e["routable"] and (e["dirty"] or e["version"] != 1):
            cluster.fail(f"engine {name} serves version {e['version']} dirty={e['dirty']} after the abort")
    print(f"aborted round: {status['last_round']}")
    # A new process for rank 0 joins as the next incarnation and the fleet moves on.
    before = {r["rank"]: r["incarnation"] for r in status["ranks"]}
    a2 = Worker(c.topology, 0)
    # It counts again from its checkpoint: a number the fleet already serves
    # is refused (no round would sync it), nothing lost.
    refused = a2.ask("publish 1", "error ValueError")
    if "the fleet already serves version 1" not in refused:
        cluster.fail(f"a restarted rank's old version number: {refused}")
    a2.ask("publish 3"), b.ask("publish 3")
    a2.ask("wait 3 90", "ok synced 3")
    status = json.loads(a2.ask("status")[3:])
    after = {r["rank"]: r["incarnation"] for r in status["ranks"]}
    if not after[0] > before[0]:
        cluster.fail(f"rank 0's incarnation did not grow: {before} -> {after}")
    for name, e in status["engines"].items():
        if e["version"] != 3 or e["dirty"] or not e["routable"]:
            cluster.fail(f"engine {name} after the new rank: {e}")
    # What the engines serve is version 3's whole model, token for token.
    torch.manual_seed(3)
    config = tl.LlamaConfig.from_dict(rlsync.Topology(c.topology).model)
    state = tl.bf16_state_dict(tl.TinyLlama(config))
    prompt = [256] + list(b"rlsync")
    body = json.dumps({"prompt": [prompt], "max_tokens": 12, "temperature": 0, "ignore_eos": True}).encode()
    with urllib.request.urlopen(urllib.request.Request(c.url + "/v1/completions", data=body,
                                                       headers={"Content-Type": "application/json"}), timeout=30) as r:
        got = json.loads(r.read())["choices"][0]["token_ids"]
    want = tl.greedy_decode(state, prompt, 12, config=config, stop_at_eos=False)
    if got != want:
        cluster.fail(f"the fleet's greedy tokens {got} differ from TinyLlama's {want} on version 3")
    for w in (a2, b):
        w.p.stdin.close()
        w.p.wait(30)
print("PASS")
