"""Train a tiny Llama with PyTorch and publish every step to an rlsync fleet.

The loop in ten lines (``batches`` yields (ids, targets) pairs of [B, T] token ids)::

    import rlsync, torch
    from tiny_llama import TinyLlama, bf16_state_dict
    model = TinyLlama(rlsync.Topology("topology.yaml").model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with rlsync.TrainerRank("topology.yaml", rank=0) as rank:
        for step, (ids, targets) in enumerate(batches, start=1):
            loss = torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), targets.flatten())
            opt.zero_grad(); loss.backward(); opt.step()
            rank.publish(step, bf16_state_dict(model))   # copied; training goes on at once
        rank.wait_synced(step, timeout_s=60.0)           # every live engine serves `step`

This file is that loop, plus what shows it works: a background thread asks
the head's ``/v1/completions`` for sampled rollouts while the model trains
(engines keep serving through each sync), and at the end the fleet's greedy
completions (engines that got the weights only through publish -> sync) are
compared token by token with TinyLlama's own greedy decode of the same final
bf16 weights, widened to fp32 as the engine does.

    python3 train_and_sync.py --topology topology.yaml --steps 30

The topology needs a head with an HTTP port (router_url) and a trainer rank
whose ``source`` is ``external``. The greedy comparison expects engines of
kind builtin, which compute in fp32 as TinyLlama does here; a vLLM server
computes in bf16 and may pick other tokens where two are close. If the head's HTTP port requires a key, put
it in the environment variable RLSYNC_API_KEY.

Exit status: 0 when every greedy completion matched, 1 on a mismatch or a
failure (printed), 2 on bad arguments or a topology the example cannot use.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Mapping, Sequence

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiny_llama as tl  # noqa: E402  (beside this file)

# What the model learns: next byte of a repeating text. Loss drops within a few dozen Adam steps.
PATTERN = b"rlsync moves weights from trainers to engines. "
MAX_RESPONSE_BYTES = 16 << 20
API_KEY_ENV = "RLSYNC_API_KEY"


# -- HTTP, stdlib only -----------------------------------------------------------------

class HttpError(Exception):
    """A request that failed: no answer, an HTTP error status, or a body that is not what was asked for."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def post_json(url: str, body: Mapping, api_key: str | None, timeout_s: float) -> dict:
    """POST `body` as JSON; returns the JSON object answered. Raises HttpError naming `url`."""
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    request = urllib.request.Request(url, data=json.dumps(body).encode("utf-8"), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            raw = response.read(MAX_RESPONSE_BYTES + 1)
    except urllib.error.HTTPError as e:
        detail = e.read(2000).decode("utf-8", "replace").strip()
        raise HttpError(f"POST {url}: HTTP {e.code}: {detail}", e.code) from None
    except (urllib.error.URLError, OSError) as e:  # refused, reset, timed out
        raise HttpError(f"POST {url}: {getattr(e, 'reason', e)}") from None
    except http.client.HTTPException as e:  # a malformed or truncated response
        raise HttpError(f"POST {url}: {type(e).__name__}: {e}") from None
    if len(raw) > MAX_RESPONSE_BYTES:
        raise HttpError(f"POST {url}: response larger than {MAX_RESPONSE_BYTES} bytes")
    try:
        answer = json.loads(raw)
    except ValueError as e:
        raise HttpError(f"POST {url}: response is not JSON ({e}): {raw[:200]!r}") from None
    if not isinstance(answer, dict):
        raise HttpError(f"POST {url}: expected a JSON object, got {type(answer).__name__}")
    return answer


def served_versions(answer: dict) -> set[str]:
    """The weight-version labels rlsync adds to its choices (weight_versions spans); empty when absent."""
    labels = set()
    for choice in answer.get("choices") or []:
        spans = choice.get("weight_versions") if isinstance(choice, dict) else None
        for span in spans if isinstance(spans, list) else []:
            if isinstance(span, dict) and "version" in span:
                labels.add(str(span["version"]))
    return labels


def completion_token_ids(answer: dict, prompts: int, url: str) -> list[list[int]]:
    """choices[i].token_ids, ordered by choice index (one choice per prompt)."""
    choices = answer.get("choices")
    if not isinstance(choices, list) or len(choices) != prompts:
        raise HttpError(f"POST {url}: expected {prompts} choices, got {json.dumps(choices)[:200]}")
    out: list[list[int] | None] = [None] * prompts
    for i, choice in enumerate(choices):
        index = choice.get("index") if isinstance(choice, dict) else None
        ids = choice.get("token_ids") if isinstance(choice, dict) else None
        if not isinstance(index, int) or not 0 <= index < prompts or out[index] is not None:
            raise HttpError(f"POST {url}: choices[{i}].index: expected a distinct index below {prompts}, got {index!r}")
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise HttpError(f"POST {url}: choices[{i}].token_ids: expected a list of token ids, got "
                            f"{json.dumps(ids)[:200]}")
        out[index] = ids
    return out  # type: ignore[return-value]


def api_key_from_env() -> str | None:
    key = os.environ.get(API_KEY_ENV, "").strip()
    return key or None


# -- synthetic data --------------------------------------------------------------------

def pattern_tokens(offset: int, length: int) -> list[int]:
    """`length` bytes of the repeating PATTERN, starting at `offset`."""
    return [PATTERN[(offset + i) % len(PATTERN)] for i in range(length)]


def training_batch(gen: torch.Generator, batch: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [B, T] = BOS + pattern from a random offset; targets [B, T] = the next tokens."""
    offsets = torch.randint(0, len(PATTERN), (batch,), generator=gen).tolist()
    rows = [[tl.TOKEN_BOS] + pattern_tokens(o, seq_len) for o in offsets]
    data = torch.tensor(rows, dtype=torch.long)
    return data[:, :-1], data[:, 1:]


def check_prompts(count: int, length: int) -> list[list[int]]:
    """Prompts as the fleet gets them: token ids, BOS first (a token-id prompt gets no BOS added)."""
    step = max(1, len(PATTERN) // max(1, count))
    return [[tl.TOKEN_BOS] + pattern_tokens(i * step, length) for i in range(count)]


# -- rollouts while training -----------------------------------------------------------

class Rollouts(threading.Thread):
    """Asks the head for sampled completions, one request at a time, until stopped.

    Engines pause briefly while they take a new version; a failed request is
    retried with a growing delay, and the thread gives up (recording why)
    after `max_consecutive_failures` failures in a row.
    """

    def __init__(self, url: str, api_key: str | None, prompt_len: int, max_tokens: int, timeout_s: float,
                 seed: int, max_consecutive_failures: int = 20):
        super().__init__(name="rollouts", daemon=True)
        self.url, self.api_key, self.timeout_s = url, api_key, timeout_s
        self.prompt_len, self.max_tokens = prompt_len, max_tokens
        self.max_consecutive_failures = max_consecutive_failures
        self.rng = random.Random(seed)
        self.stopping = threading.Event()
        self.completions = 0
        self.tokens = 0
        self.failures = 0
        self.gave_up: str | None = None
        self.last_error: str | None = None

    def stop(self, timeout_s: float) -> None:
        self.stopping.set()
        self.join(timeout_s)

    def run(self) -> None:
        consecutive = 0
        while not self.stopping.is_set():
            prompts = [[tl.TOKEN_BOS] + pattern_tokens(self.rng.randrange(len(PATTERN)), self.prompt_len)
                       for _ in range(4)]
            body = {"prompt": prompts, "max_tokens": self.max_tokens, "temperature": 1.0,
                    "seed": self.rng.randrange(1 << 31), "return_token_ids": True}
            try:
                ids = completion_token_ids(post_json(self.url, body, self.api_key, self.timeout_s),
                                           len(prompts), self.url)
            except HttpError as e:
                self.failures += 1
                consecutive += 1
                self.last_error = str(e)
                if consecutive >= self.max_consecutive_failures:
                    self.gave_up = f"{consecutive} failed requests in a row, the last: {e}"
                    return
                self.stopping.wait(min(2.0, 0.05 * 2 ** consecutive))
                continue
            consecutive = 0
            self.completions += len(ids)
            self.tokens += sum(len(t) for t in ids)


# -- the fleet's greedy completions against TinyLlama's -----------------------------------

def fleet_greedy(url: str, api_key: str | None, prompts: Sequence[Sequence[int]], max_tokens: int,
                 timeout_s: float, attempts: int = 5) -> tuple[list[list[int]], set[str]]:
    """Greedy completions of `prompts` (token ids each) and the weight versions that served them."""
    body = {"prompt": [list(p) for p in prompts], "max_tokens": max_tokens, "temperature": 0.0,
            "return_token_ids": True}
    for attempt in range(1, attempts + 1):
        try:
            answer = post_json(url, body, api_key, timeout_s)
            return completion_token_ids(answer, len(prompts), url), served_versions(answer)
        except HttpError as e:
            # 4xx means the request itself is wrong: retrying would not help.
            if attempt == attempts or (e.status is not None and 400 <= e.status < 500 and e.status != 429):
                raise
            time.sleep(0.2 * 2 ** attempt)
    raise AssertionError("unreachable")


def first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def show(ids: Sequence[int]) -> str:
    return repr(tl.decode(ids).decode("utf-8", "replace")) + (" +EOS" if tl.TOKEN_EOS in ids else "")


# -- main ------------------------------------------------------------------------------

def parse_layers(text: str) -> list[int]:
    """'0-3,6' -> [0, 1, 2, 3, 6]."""
    out: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi if sep else lo)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r}: expected a layer or a range such as 0-3") from None
        if first < 0 or last < first:
            raise argparse.ArgumentTypeError(f"{part!r}: expected a non-negative, ascending range")
        out.update(range(first, last + 1))
    return sorted(out)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Train a tiny Llama, publish every step to rlsync, check the fleet.")
    p.add_argument("--topology", required=True, help="the cluster's topology.yaml")
    p.add_argument("--rank", type=int, default=0, help="trainer rank this process provides (default 0)")
    p.add_argument("--steps", type=int, default=30, help="training steps, each published (default 30)")
    p.add_argument("--lr", type=float, default=1e-2, help="Adam learning rate (default 0.01)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the data (default 0)")
    p.add_argument("--batch", type=int, default=16, help="sequences per step (default 16)")
    p.add_argument("--seq-len", type=int, default=48, help="tokens per training sequence (default 48)")
    p.add_argument("--layers", type=parse_layers, default=None,
                   help="layers this rank holds, e.g. 0-3,6 (default: the topology's rank's); publishes only their tensors "
                        "(the embedding goes with layer 0, the final norm and lm_head with the last)")
    p.add_argument("--first-version", type=int, default=1,
                   help="version of the first step's weights; later steps count up (default 1)")
    p.add_argument("--timeout-s", type=float, default=60.0,
                   help="how long to wait for every engine to serve the last version (default 60)")
    p.add_argument("--request-timeout-s", type=float, default=30.0, help="per HTTP request (default 30)")
    p.add_argument("--check-prompts", type=int, default=4, help="prompts for the greedy comparison (default 4)")
    p.add_argument("--max-tokens", type=int, default=24, help="tokens per completion (default 24)")
    p.add_argument("--prompt-len", type=int, default=8, help="pattern bytes per prompt, after BOS (default 8)")
    p.add_argument("--no-rollouts", action="store_true", help="do not send rollout requests while training")
    args = p.parse_args(argv)
    for name in ("steps", "batch", "seq_len", "check_prompts", "max_tokens", "prompt_len"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: must be at least 1")
    if args.rank < 0 or args.first_version < 0:
        p.error("--rank and --first-version: must not be negative")
    for name in ("lr", "timeout_s", "request_timeout_s"):
        if not getattr(args, name) > 0:
            p.error(f"--{name.replace('_', '-')}: must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import rlsync  # the binding: PYTHONPATH=build/python

    try:
        topology = rlsync.Topology(args.topology)  # errors name file:line:col
        config = tl.LlamaConfig.from_dict(topology.model)
    except (ValueError, OSError, RuntimeError) as e:
        print(f"train_and_sync: {args.topology}: {e}", file=sys.stderr)
        return 2
    if not topology.router_url:
        print(f"train_and_sync: {args.topology}: the head has no HTTP port (router_url): "
              "nothing to ask for rollouts and greedy completions", file=sys.stderr)
        return 2
    # Prompts and training sequences must fit the model's positions.
    if args.prompt_len + 1 + args.max_tokens > config.max_position_embeddings:
        print(f"train_and_sync: --prompt-len {args.prompt_len} + BOS + --max-tokens {args.max_tokens} exceed "
              f"max_position_embeddings ({config.max_position_embeddings})", file=sys.stderr)
        return 2
    # What this rank holds: --layers, else the topology's trainer.ranks[rank] (its layers and, for a
    # mixture of experts split over ranks, its experts).
    ranks = topology.ranks
    own = ranks[args.rank] if 0 <= args.rank < len(ranks) else {}
    try:
        held = tl.names_of_layers(config, args.layers if args.layers is not None
                                  else own.get("layers", range(config.num_hidden_layers)),
                                  own.get("experts"))
    except ValueError as e:
        print(f"train_and_sync: --layers: {e}", file=sys.stderr)
        return 2
    seq_len = min(args.seq_len, config.max_position_embeddings)
    url = topology.router_url.rstrip("/") + "/v1/completions"
    api_key = api_key_from_env()

    torch.manual_seed(args.seed)
    model = tl.TinyLlama(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    data = torch.Generator().manual_seed(args.seed)
    losses: list[float] = []
    published: dict[str, torch.Tensor] = {}
    version = args.first_version - 1
    rollouts = None
    publish_s = 0.0

    with rlsync.TrainerRank(args.topology, rank=args.rank) as rank:
        if not args.no_rollouts:
            rollouts = Rollouts(url, api_key, args.prompt_len, args.max_tokens, args.request_timeout_s, args.seed)
            rollouts.start()
        try:
            for step in range(args.steps):
                ids, targets = training_batch(data, args.batch, seq_len)
                loss = F.cross_entropy(model(ids).flatten(0, 1), targets.flatten())
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                losses.append(float(loss))
                version = args.first_version + step
                published = tl.bf16_state_dict(model)
                t0 = time.monotonic()
                # publish copies: `published` could change now without harm.
                try:
                    rank.publish(version, {name: published[name] for name in held})
                except (ValueError, TypeError) as e:  # the binding names the tensor at fault
                    print(f"FAIL: publish of version {version}: {e}")
                    return 1
                publish_s += time.monotonic() - t0
                print(f"step {step + 1}/{args.steps}: loss {losses[-1]:.4f}, published version {version}", flush=True)
        finally:
            if rollouts:
                rollouts.stop(args.request_timeout_s + 5)
        t0 = time.monotonic()
        try:
            rank.wait_synced(version, timeout_s=args.timeout_s)
        except Exception as e:  # the binding's timeout or a dead cluster: say which version, then stop
            print(f"FAIL: version {version} not served by every engine within {args.timeout_s} s: {e}")
            return 1
        synced_s = time.monotonic() - t0
        status = rank.status()

    prompts = check_prompts(args.check_prompts, args.prompt_len)
    try:
        fleet, versions = fleet_greedy(url, api_key, prompts, args.max_tokens, args.request_timeout_s)
    except HttpError as e:
        print(f"FAIL: greedy completions from the fleet: {e}")
        return 1
    mismatches = 0
    print()
    print(f"loss: first {losses[0]:.4f}, last {losses[-1]:.4f} over {len(losses)} steps")
    print(f"publish: {publish_s / len(losses) * 1e3:.1f} ms a step on average; "
          f"version {version} served everywhere {synced_s:.2f} s after the last publish returned")
    if rollouts:
        line = f"rollouts served while training: {rollouts.completions} completions, {rollouts.tokens} tokens"
        if rollouts.failures:
            line += f"; {rollouts.failures} failed requests (retried), the last: {rollouts.last_error}"
        print(line)
        if rollouts.gave_up:
            print(f"rollouts stopped early: {rollouts.gave_up}")
    print(f"fleet status: {json.dumps(status, default=str)[:2000]}")
    if versions:
        print(f"greedy completions served by weight version(s): {', '.join(sorted(versions))}")
    # Labels are decimal versions unless the cluster names them; decimal ones must be the last published.
    if versions and all(v.isdigit() for v in versions) and versions != {str(version)}:
        print(f"FAIL: the fleet answered with version(s) {sorted(versions)}, not {version}")
        mismatches += 1
    for i, (prompt, got) in enumerate(zip(prompts, fleet)):
        want = tl.greedy_decode(published, prompt, args.max_tokens, config=config)
        if got == want:
            print(f"prompt {i}: match ({len(want)} tokens) {show(prompt[1:])} -> {show(want)}")
        else:
            mismatches += 1
            at = first_difference(got, want)
            print(f"prompt {i}: MISMATCH at token {at}: {show(prompt[1:])}\n"
                  f"  fleet     {got}\n  TinyLlama {want}")
    if mismatches:
        print(f"FAIL: {mismatches} problem(s): greedy completions that differ from TinyLlama's, or stale weights")
        return 1
    if rollouts and rollouts.gave_up:
        print("FAIL: the rollouts gave up while training")
        return 1
    if len(losses) >= 2 and not losses[-1] < losses[0]:
        print("FAIL: the loss did not drop")
        return 1
    print(f"PASS: all {len(prompts)} greedy completions equal TinyLlama's, token for token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
