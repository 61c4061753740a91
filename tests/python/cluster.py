"""A throwaway rlsync cluster on this machine for the python tests: a head
node (`rlsync node`: coordinator, router with its HTTP port, built-in engines)
and a node `trainer` whose ranks are external (the test's Python processes
join as them), over mutual TLS with per-node secrets from `rlsync certs make`.

Every wait here has a deadline; a head that outlives its test is killed.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))
EXAMPLES = os.path.join(SOURCE, "tools", "python", "examples")


def require_torch():
    """Exits with ctest's skip code and a message when torch is missing."""
    try:
        import torch  # noqa: F401
    except ImportError:
        print(f"SKIP: PyTorch is not installed for {sys.executable} (apt-get install python3-torch)")
        sys.exit(SKIP)


def import_rlsync(build_dir: str):
    """The module built in BUILD_DIR/python; exits 77 when it was not built."""
    path = os.path.join(build_dir, "python")
    if not os.path.isdir(os.path.join(path, "rlsync")):
        print(f"SKIP: no rlsync Python module in {path} (install python3-dev and pybind11-dev, then build)")
        sys.exit(SKIP)
    sys.path.insert(0, path)
    sys.path.insert(0, EXAMPLES)
    import rlsync

    return rlsync


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fail(message: str):
    print("FAIL: " + message)
    sys.exit(1)


MODEL = dict(layers=4, hidden_size=64, heads=4, kv_heads=2, intermediate_size=128, vocab_size=320)


def topology_text(*, port: int, http_port: int, certs: str, ranks: list[str], engines: int = 2, tp: int = 1,
                  backend: str = "ucx", model: dict | None = None, transfer_ms: int = 20000,
                  every_versions: int = 1, extra: str = "", engine_keys: str = "") -> str:
    """Two nodes on 127.0.0.1: `head` (coordinator, router, engines) and
    `trainer` (the external ranks, each holding the layers given, e.g. "0-1",
    or layers and experts, e.g. "all/0-3"). `model` may add synthetic keys
    (arch, experts, ...); `engine_keys` is appended to every engine entry."""
    m = dict(MODEL, **(model or {}))
    moe_lines = "".join(f"    {k}: {v}\n" for k, v in m.items() if k not in MODEL)

    def rank_line(held: str) -> str:
        layers, _, experts = held.partition("/")
        return (f"    - {{node: trainer, layers: \"{layers}\"" + (f", experts: \"{experts}\"" if experts else "")
                + "}\n")

    rank_lines = "".join(rank_line(held) for held in ranks)
    engine_lines = "".join(f"  - {{name: rollout-{i}, node: head, tp: {tp}{engine_keys}}}\n" for i in range(engines))
    return f"""name: python-test
model:
  synthetic:
    layers: {m['layers']}
    hidden_size: {m['hidden_size']}
    heads: {m['heads']}
    kv_heads: {m['kv_heads']}
    intermediate_size: {m['intermediate_size']}
    vocab_size: {m['vocab_size']}
    dtype: bf16
{moe_lines}nodes:
  - {{name: head, address: 127.0.0.1, port: {port}}}
  - {{name: trainer, address: 127.0.0.1}}
cluster:
  tls: {{ca: {certs}/ca.pem, cert: "{certs}/{{node}}.pem", key: "{certs}/{{node}}.key"}}
  secret_file: "{certs}/{{node}}.secret"
  heartbeat_interval_ms: 200
  heartbeat_timeout_ms: 1500
  connect_deadline_ms: 10000
trainer:
  node: trainer
  source: external
  ranks:
{rank_lines}engines:
{engine_lines}router:
  node: head
  http_port: {http_port}
coordinator:
  node: head
transfer:
  backend: {backend}
  mode: sharded
sync:
  every_versions: {every_versions}
  staleness: {max(1, every_versions - 1)}
  deadlines_ms: {{pause: 5000, flush: 2000, start: 2000, transfer: {transfer_ms}, finish: 5000, continue: 2000}}
{extra}"""


class Cluster:
    """Certificates, a topology and the head's process; a context manager."""

    def __init__(self, rlsync_bin: str, *, ranks: list[str], drill_events: bool = False, **topology):
        self.bin = rlsync_bin
        self.dir = tempfile.mkdtemp(prefix="rlsync-python-")
        self.certs = os.path.join(self.dir, "certs")
        run([rlsync_bin, "certs", "make", "--out", self.certs, "--nodes", "head,trainer"], timeout=60)
        self.port, self.http_port = free_port(), free_port()
        self.topology = os.path.join(self.dir, "topology.yaml")
        with open(self.topology, "w") as f:
            f.write(topology_text(port=self.port, http_port=self.http_port, certs=self.certs, ranks=ranks, **topology))
        self.url = f"http://127.0.0.1:{self.http_port}"
        self.drill_events = drill_events
        self.lines: list[str] = []
        self.cond = threading.Condition()
        self.head = None

    def __enter__(self):
        argv = [self.bin, "node", "--topology", self.topology, "--node", "head"]
        if self.drill_events:
            argv.append("--drill-events")
        self.head = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        threading.Thread(target=self._read, daemon=True).start()
        self.wait_for(r"gatekeeper on", 30, "the head to come up")
        return self

    def _read(self):
        for line in self.head.stderr:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()

    def wait_for(self, pattern: str, timeout_s: float, what: str, start: int = 0) -> int:
        """Index of the first head line from `start` matching `pattern`; fails past the timeout."""
        regex = re.compile(pattern)
        give_up = time.monotonic() + timeout_s
        with self.cond:
            while True:
                for i in range(start, len(self.lines)):
                    if regex.search(self.lines[i]):
                        return i
                left = give_up - time.monotonic()
                if left <= 0 or self.head.poll() is not None:
                    self.dump()
                    fail(f"waited {timeout_s} s for {what} (/{pattern}/)")
                self.cond.wait(min(left, 0.2))

    def dump(self):
        print("---- head's stderr ----")
        with self.cond:
            for line in self.lines[-80:]:
                print(line)

    def __exit__(self, *exc):
        if self.head and self.head.poll() is None:
            self.head.send_signal(signal.SIGTERM)
            try:
                self.head.wait(15)
            except subprocess.TimeoutExpired:
                self.head.kill()
                self.head.wait(5)
        return False


def run(argv: list[str], timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    if p.returncode != 0:
        fail(f"{' '.join(argv)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p


def python_env(build_dir: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(build_dir, "python"), EXAMPLES])
    return env


def run_example_ranks(c: Cluster, build_dir: str, per_rank: list[list[str]], steps: int) -> None:
    """Runs train_and_sync.py once per rank (rank i with per_rank[i]'s extra
    flags; the ranks after the first send no rollouts) against cluster `c`,
    and fails unless each one's greedy completions equal TinyLlama's and the
    fleet's status lists the last rank."""
    example = os.path.join(EXAMPLES, "train_and_sync.py")
    common = [sys.executable, example, "--topology", c.topology, "--steps", str(steps), "--timeout-s", "90"]
    env = python_env(build_dir)
    env["OMP_NUM_THREADS"] = "1"  # several trainers on two cores; one thread each trains identically
    ranks = [subprocess.Popen(common + ["--rank", str(i)] + extra + ([] if i == 0 else ["--no-rollouts"]),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for i, extra in enumerate(per_rank)]
    outputs = []
    for p in ranks:
        try:
            out, _ = p.communicate(timeout=400)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        outputs.append(out)
    for i, out in enumerate(outputs):
        print(f"---- rank {i} ----\n{out}")
    for i, p in enumerate(ranks):
        if p.returncode != 0 or "PASS: all 4 greedy completions equal TinyLlama's" not in outputs[i]:
            c.dump()
            fail(f"rank {i} exited {p.returncode}")
    # Every round pulled from every rank: the status of the last one names them.
    if f'"rank": {len(ranks) - 1}' not in outputs[0]:
        fail(f"the fleet status does not list rank {len(ranks) - 1}")
    # The last round's engines pulled, and its report says for how long.
    pulled = re.search(r'"slowest_pull_ms": ([0-9.e+-]+)', outputs[0])
    if not pulled or float(pulled.group(1)) <= 0:
        fail("the fleet status's last round names no engine's pull time")
