"""train_and_sync.py end to end, without the rlsync binding or a cluster.

Usage: python3 tools/python/tests/test_train_and_sync_offline.py BUILD_DIR

Runs the example in a subprocess against two stand-ins, so that its own
logic (arguments, training, publishing, rollouts with retries, the final
comparison) is checked before the binding exists, on the engine's real
numerics:

* a stand-in ``rlsync`` module (written to a temporary directory that leads
  PYTHONPATH): ``Topology`` reads a JSON file; ``TrainerRank.publish``
  checks names, shapes, dtypes, contiguity and the device as the binding
  must, and writes each version as a Hugging Face checkpoint;
  ``wait_synced`` waits until the stand-in head has loaded that version.
* a stand-in head (an HTTP server in this process) serving
  ``/v1/completions``: it answers 503 until the first version is published
  (the example must retry), requires a bearer key, and generates with
  ``BUILD_DIR/rlsync generate`` on the newest checkpoint, so the greedy
  tokens the example compares come from rlsync's engine.

Checks: exit 0 and a PASS line; the loss dropped; rollouts were served;
every version was published in order; the ten-line loop of the example's
docstring (the README's) runs as written; a run where the head answers with
the wrong tokens exits 1 with MISMATCH lines, and one where it answers from
an older version exits 1 naming it. Exit 77 when torch is missing.
"""

from __future__ import annotations

import http.server
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(os.path.dirname(HERE), "examples")
SKIP = 77
EXAMPLE_TIMEOUT_S = 300
GENERATE_TIMEOUT_S = 60
API_KEY = "offline-test-key"
BOS, EOS = 256, 257

CONFIG = dict(vocab_size=288, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)

STANDIN_RLSYNC = r'''
"""Stand-in for the rlsync binding (test_train_and_sync_offline.py): same calls, local files."""
import json, os, sys, time
import torch
sys.path.insert(0, os.environ["RLSYNC_STANDIN_EXAMPLES"])
import tiny_llama as tl

_DTYPES = {torch.bfloat16, torch.float16, torch.float32}


class Topology:
    def __init__(self, path):
        with open(path) as f:
            d = json.load(f)
        self.model = d["model"]
        self.router_url = d["router_url"]
        self.checkpoints = d["checkpoints"]


class TrainerRank:
    def __init__(self, topology_path, rank=0):
        self.topology = Topology(topology_path)
        if rank != 0:
            raise ValueError(f"rank {rank}: the stand-in topology has rank 0 only")
        self.shapes = {n: tuple(t.shape) for n, t in tl.TinyLlama(self.topology.model).state_dict().items()}
        self.last = None
        self.closed = False

    def publish(self, version, state_dict):
        if self.closed:
            raise RuntimeError("publish after close")
        if self.last is not None and version <= self.last:
            raise ValueError(f"version {version}: not after {self.last}")
        if set(state_dict) != set(self.shapes):
            raise ValueError(f"names: missing {sorted(set(self.shapes) - set(state_dict))}, "
                             f"unexpected {sorted(set(state_dict) - set(self.shapes))}")
        for name, t in state_dict.items():
            if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or not t.is_contiguous() \
                    or t.dtype not in _DTYPES or tuple(t.shape) != self.shapes[name]:
                raise ValueError(f"{name}: not a contiguous CPU tensor of bf16/f16/f32 shaped {self.shapes[name]}")
        final = os.path.join(self.topology.checkpoints, f"v{version:06d}")
        tl.write_checkpoint(final + ".tmp", state_dict, self.topology.model)
        os.rename(final + ".tmp", final)
        self.last = version

    def wait_synced(self, version, timeout_s=60.0):
        deadline = time.monotonic() + timeout_s
        loaded = os.path.join(self.topology.checkpoints, "loaded")
        while time.monotonic() < deadline:
            try:
                with open(loaded) as f:
                    if int(f.read().strip() or -1) >= version:
                        return
            except FileNotFoundError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"version {version} not served within {timeout_s} s")

    def status(self):
        return {"engines": {"standin-head": self.last}}

    def close(self):
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
'''


class StandinHead(http.server.ThreadingHTTPServer):
    """/v1/completions over `rlsync generate` on the newest checkpoint in `checkpoints`."""

    daemon_threads = True

    def __init__(self, rlsync: str, checkpoints: str, fault: str):
        super().__init__(("127.0.0.1", 0), Handler)
        # fault: "" (honest), "wrong-token" (greedy choice 1 gets a wrong third token),
        # "stale" (greedy answers from the version before the newest, labelled as such).
        if fault not in ("", "wrong-token", "stale"):
            raise ValueError(f"stand-in head: unknown fault {fault!r}")
        self.rlsync, self.checkpoints, self.fault = rlsync, checkpoints, fault
        self.lock = threading.Lock()
        self.served = {"sampled": 0, "greedy": 0, "refused": 0}
        self.errors: list[str] = []

    def service_actions(self):
        # Between requests too: an idle engine still takes new versions.
        with self.lock:
            self.newest()

    def newest(self) -> tuple[int, str] | None:
        versions = sorted(int(n[1:]) for n in os.listdir(self.checkpoints) if re.fullmatch(r"v\d{6}", n))
        if not versions:
            return None
        # "Loading" the newest version: wait_synced in the stand-in binding watches this file.
        with open(os.path.join(self.checkpoints, "loaded"), "w") as f:
            f.write(str(versions[-1]))
        return versions[-1], os.path.join(self.checkpoints, f"v{versions[-1]:06d}")

    def generate(self, ckpt: str, prompt: list[int], max_tokens: int, temperature: float, seed: int) -> list[int]:
        # rlsync generate takes text and adds BOS itself: the example's prompts are BOS + ASCII.
        if prompt[0] != BOS or not all(32 <= t < 127 for t in prompt[1:]):
            raise ValueError(f"prompt {prompt}: not BOS followed by printable ASCII")
        text = bytes(prompt[1:]).decode("ascii")
        cmd = [self.rlsync, "generate", "--checkpoint", ckpt, "--prompt", text, "--max-tokens", str(max_tokens),
               "--temperature", str(temperature), "--seed", str(seed), "--json"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=GENERATE_TIMEOUT_S)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip()}")
        out = json.loads(r.stdout)
        if out["prompt_token_ids"] != prompt:
            raise RuntimeError(f"rlsync generate encoded {text!r} as {out['prompt_token_ids']}, not {prompt}")
        return out["token_ids"]


class Handler(http.server.BaseHTTPRequestHandler):
    server: StandinHead

    def log_message(self, *args):  # quiet
        pass

    def reply(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        s = self.server
        if self.path != "/v1/completions":
            return self.reply(404, {"error": f"no route {self.path}"})
        if self.headers.get("Authorization") != "Bearer " + API_KEY:
            return self.reply(401, {"error": "Unauthorized"})
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
            prompts, temperature = body["prompt"], float(body["temperature"])
            max_tokens, seed = int(body["max_tokens"]), int(body.get("seed", 0))
            if body.get("return_token_ids") is not True:
                raise ValueError("return_token_ids: the example must ask for token ids")
        except (ValueError, KeyError, TypeError) as e:
            with s.lock:
                s.errors.append(f"bad request: {e}")
            return self.reply(400, {"error": str(e)})
        with s.lock:  # one generation at a time, on the version current now
            newest = s.newest()
            if newest is None:
                s.served["refused"] += 1
                return self.reply(503, {"error": "no weights yet"})
            version, ckpt = newest
            if temperature == 0 and s.fault == "stale" and version > 1:
                version -= 1
                ckpt = os.path.join(s.checkpoints, f"v{version:06d}")
            try:
                choices = []
                for i, p in enumerate(prompts):
                    ids = s.generate(ckpt, p, max_tokens, temperature, seed + i)
                    if temperature == 0 and s.fault == "wrong-token" and i == 1:
                        ids = ids[:2] + [(ids[2] + 1) % 256] + ids[3:]
                    choices.append({"index": i, "text": "", "token_ids": ids, "finish_reason": "length",
                                    "weight_versions": [{"version": str(version), "start": 0, "end": len(ids)}]})
                s.served["greedy" if temperature == 0 else "sampled"] += len(prompts)
            except (ValueError, RuntimeError, subprocess.TimeoutExpired) as e:
                s.errors.append(str(e))
                return self.reply(500, {"error": str(e)})
        self.reply(200, {"object": "text_completion", "model": f"v{version}", "choices": choices})


def run_with_standins(rlsync: str, tmp: str, name: str, fault: str, args: list[str],
                      timeout_s: float = EXAMPLE_TIMEOUT_S) -> tuple[int, str, StandinHead]:
    """Runs `python3 ARGS` in a fresh directory holding topology.yaml, beside a stand-in head and binding."""
    work = os.path.join(tmp, name)
    checkpoints = os.path.join(work, "checkpoints")
    module_dir = os.path.join(work, "module")
    os.makedirs(checkpoints)
    os.makedirs(module_dir)
    with open(os.path.join(module_dir, "rlsync.py"), "w") as f:
        f.write(STANDIN_RLSYNC)
    head = StandinHead(rlsync, checkpoints, fault)
    threading.Thread(target=head.serve_forever, name="standin-head", daemon=True).start()
    # JSON is YAML: the stand-in Topology reads it with json.
    with open(os.path.join(work, "topology.yaml"), "w") as f:
        json.dump({"model": CONFIG, "router_url": f"http://127.0.0.1:{head.server_address[1]}",
                   "checkpoints": checkpoints}, f)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([module_dir, EXAMPLES]), RLSYNC_STANDIN_EXAMPLES=EXAMPLES,
               RLSYNC_API_KEY=API_KEY)
    try:
        r = subprocess.run([sys.executable] + args, capture_output=True, text=True, env=env, cwd=work,
                           timeout=timeout_s)
    finally:
        head.shutdown()
        head.server_close()
    output = r.stdout + r.stderr
    print(f"--- {name}: exit {r.returncode}\n{output}")
    return r.returncode, output, head


def run_example(rlsync: str, tmp: str, name: str, fault: str, steps: int) -> tuple[int, str, StandinHead]:
    return run_with_standins(rlsync, tmp, name, fault, [
        os.path.join(EXAMPLES, "train_and_sync.py"), "--topology", "topology.yaml", "--steps", str(steps),
        "--seq-len", "40", "--check-prompts", "3", "--max-tokens", "16", "--timeout-s", "60", "--seed", "3"])


def ten_line_loop() -> str:
    """The loop in train_and_sync.py's docstring (the README's), dedented."""
    with open(os.path.join(EXAMPLES, "train_and_sync.py"), encoding="utf-8") as f:
        doc = f.read().split('"""')[1]
    block = doc.split("::\n\n", 1)[1]
    lines = []
    for line in block.splitlines():
        if line and not line.startswith("    "):
            break
        lines.append(line[4:])
    return "\n".join(lines).strip() + "\n"


def run_ten_line_loop(rlsync: str, tmp: str) -> list[str]:
    """The docstring's loop runs as written (batches given) and publishes one version per batch."""
    loop = ten_line_loop()
    code_lines = [line for line in loop.splitlines() if line.strip()]
    failures = [] if len(code_lines) == 10 else [f"ten-line loop: {len(code_lines)} lines:\n{loop}"]
    script = os.path.join(tmp, "ten_line_loop.py")
    with open(script, "w") as f:
        f.write("import torch, train_and_sync\n"
                "data = torch.Generator().manual_seed(0)\n"
                "batches = [train_and_sync.training_batch(data, 4, 24) for _ in range(3)]\n"
                + loop + "print('ten-line loop: synced', step)\n")
    code, out, _ = run_with_standins(rlsync, tmp, "ten-line-loop", "", [script], timeout_s=120)
    if code != 0 or "ten-line loop: synced 3" not in out:
        failures.append(f"ten-line loop: exit {code}, did not sync version 3")
    published = sorted(os.listdir(os.path.join(tmp, "ten-line-loop", "checkpoints")))
    if [n for n in published if n != "loaded"] != ["v000001", "v000002", "v000003"]:
        failures.append(f"ten-line loop: published {published}, expected v000001..v000003")
    return failures


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        importlib.import_module("torch")  # the example's subprocess imports it
    except ImportError as e:
        print(f"SKIP test_train_and_sync_offline: PyTorch is not importable by {sys.executable} ({e}); "
              "install python3-torch and run it with /usr/bin/python3")
        return SKIP
    build = sys.argv[1]
    rlsync = next((c for c in (os.path.join(build, "rlsync"), os.path.join(build, "tools", "rlsync"))
                   if os.path.isfile(c) and os.access(c, os.X_OK)), None)
    if rlsync is None:
        print(f"test_train_and_sync_offline: no rlsync executable in {build} or {build}/tools", file=sys.stderr)
        return 1

    failures = []
    with tempfile.TemporaryDirectory(prefix="rlsync-train-offline-") as tmp:
        steps = 40
        code, out, head = run_example(rlsync, tmp, "honest-head", "", steps)
        if code != 0 or "PASS: all 3 greedy completions" not in out:
            failures.append(f"honest head: exit {code}, no PASS line")
        published = sorted(n for n in os.listdir(os.path.join(tmp, "honest-head", "checkpoints"))
                           if re.fullmatch(r"v\d{6}", n))
        if published != [f"v{v:06d}" for v in range(1, steps + 1)]:
            failures.append(f"honest head: published versions {published[:3]}..{published[-3:]}, "
                            f"expected v000001..v{steps:06d}")
        losses = re.search(r"loss: first ([\d.]+), last ([\d.]+)", out)
        if not losses or not float(losses.group(2)) < 0.5 * float(losses.group(1)):
            failures.append(f"honest head: the loss did not halve: {losses.group(0) if losses else 'no loss line'}")
        if head.served["sampled"] == 0 or "rollouts served while training: 0 " in out:
            failures.append(f"honest head: no rollouts served while training ({head.served})")
        if f"served by weight version(s): {steps}\n" not in out:
            failures.append(f"honest head: no line saying version {steps} served the greedy completions")
        if head.served["greedy"] != 3:
            failures.append(f"honest head: {head.served['greedy']} greedy completions served, expected 3")
        if head.errors:
            failures.append(f"honest head: the head saw errors: {head.errors[:3]}")

        failures += run_ten_line_loop(rlsync, tmp)

        code, out, head = run_example(rlsync, tmp, "wrong-token-head", "wrong-token", 3)
        if code != 1 or "prompt 1: MISMATCH at token 2" not in out or "FAIL: 1 problem(s)" not in out:
            failures.append(f"wrong-token head: exit {code}; expected 1 with prompt 1 mismatching at token 2")

        code, out, head = run_example(rlsync, tmp, "stale-head", "stale", 3)
        if code != 1 or "FAIL: the fleet answered with version(s) ['2'], not 3" not in out:
            failures.append(f"stale head: exit {code}; expected 1 and a line naming version 2 against 3")
    print(f"head traffic of the last run: {head.served}")
    if failures:
        print("FAIL test_train_and_sync_offline:")
        for f in failures:
            print("  " + f)
        return 1
    print("PASS test_train_and_sync_offline: the example trains, publishes, serves rollouts and "
          "matches rlsync's engine; a wrong fleet answer fails it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
