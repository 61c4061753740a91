#!/usr/bin/env bash
# /v1/completions of `rlsync serve` with real clients: curl and the `openai`
# npm package (4.x). Greedy output equals `rlsync generate` on the same
# prompt token for token, streamed or not; after a disk weight update with
# clear_cache it equals `rlsync generate --checkpoint NEW`, and the spans
# name the new version. The npm part skips (77) only when the package
# cannot be installed (no npm, registry unreachable).
set -euo pipefail
rlsync=$1
dir=$(mktemp -d)
server_pid=""
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; [ -f "$dir/serve.log" ] && sed 's/^/  serve: /' "$dir/serve.log" | tail -20; exit 1; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
npm_dir=${RLSYNC_NPM_DIR:-$(dirname "$rlsync")/../npm}

"$rlsync" checkpoint make --out "$dir/v1" --layers 2 --hidden 64 --heads 4 --kv-heads 2 --seed 3 >/dev/null
"$rlsync" checkpoint make --from "$dir/v1" --perturb 0.05 --seed 4 --out "$dir/v2" >/dev/null

"$rlsync" serve --checkpoint "$dir/v1" --tp 2 --port 0 >"$dir/serve.log" 2>&1 &
server_pid=$!
url=""
for _ in $(seq 1 200); do
  url=$(sed -n 's/^rlsync serve: listening on \(http:[^ ]*\).*/\1/p' "$dir/serve.log")
  [ -n "$url" ] && break
  kill -0 "$server_pid" 2>/dev/null || fail "rlsync serve exited"
  sleep 0.05
done
[ -n "$url" ] || fail "rlsync serve did not print its URL"

generated() { # CHECKPOINT -> token ids of rlsync generate, as JSON
  "$rlsync" generate --checkpoint "$1" --prompt "hello rlsync" --max-tokens 12 --json \
    | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["token_ids"]))'
}
served() { # STREAM -> token ids of /v1/completions (joined from the chunks when streaming)
  curl -sS -N -X POST "$url/v1/completions" -H 'Content-Type: application/json' \
    --data "{\"prompt\": \"hello rlsync\", \"max_tokens\": 12, \"temperature\": 0, \"stream\": $1}" \
    | python3 -c '
import json, sys
body = sys.stdin.read()
if body.startswith("data: "):
    events = [e[6:] for e in body.split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "[DONE]", "the stream did not end with [DONE]"
    ids = [t for e in events[:-1] for c in json.loads(e)["choices"] for t in c["token_ids"]]
    print(json.dumps(ids))
else:
    print(json.dumps(json.loads(body)["choices"][0]["token_ids"]))'
}
want=$(generated "$dir/v1")
[ "$(served false)" = "$want" ] || fail "greedy completion $(served false) differs from rlsync generate $want"
[ "$(served true)" = "$want" ] || fail "streamed completion $(served true) differs from rlsync generate $want"

# A disk update with clear_cache: then greedy output is the new checkpoint's.
post() { curl -sS -f -X POST "$url$1" -H 'Content-Type: application/json' --data "${2:-{\}}" >/dev/null \
           || fail "POST $1 failed"; }
post "/pause?mode=keep&clear_cache=true"
post /start_weight_update '{"is_checkpoint_format": true}'
post /update_weights "{\"update_info\": {\"path\": \"$dir/v2\"}}"
post /finish_weight_update '{"weight_version": "step-2"}'
post /resume
want2=$(generated "$dir/v2")
[ "$want2" != "$want" ] || fail "v2 generates what v1 did: the update proves nothing"
[ "$(served false)" = "$want2" ] || fail "after the update, $(served false) differs from rlsync generate v2 $want2"
spans=$(curl -sS -X POST "$url/v1/completions" -H 'Content-Type: application/json' \
          --data '{"prompt": "hi", "max_tokens": 4, "temperature": 0, "ignore_eos": true}' \
        | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["choices"][0]["weight_versions"], sort_keys=True))')
[ "$spans" = '[{"end": 4, "start": 0, "version": "step-2"}]' ] || fail "weight_versions after the update: $spans"

# The openai npm package, streamed and not.
if [ ! -d "$npm_dir/node_modules/openai" ]; then
  command -v npm >/dev/null || { echo "SKIP: npm is not installed (tools/lib/setup.sh installs it)"; exit 77; }
  mkdir -p "$npm_dir"
  if ! npm install --prefix "$npm_dir" --no-audit --no-fund --silent openai@4 >"$dir/npm.log" 2>&1; then
    echo "SKIP: cannot install the openai npm package (registry unreachable?): $(tail -3 "$dir/npm.log")"
    exit 77
  fi
fi
out=$(NODE_PATH="$npm_dir/node_modules" node "$here/openai_client.js" "$url" "hello rlsync" 12) \
  || fail "the openai client failed: $out"
python3 - "$out" "$want2" <<'PY' || fail "openai client: $out"
import json, sys
got, want = json.loads(sys.argv[1]), json.loads(sys.argv[2])
s = got["streamed"]
assert got["object"] == "text_completion" and got["id"].startswith("cmpl-"), got
assert got["token_ids"] == want, ("non-streamed", got["token_ids"], want)
assert s["token_ids"] == want, ("streamed", s["token_ids"], want)
assert s["text"] == got["text"] and s["finish_reason"] == got["finish_reason"], s
assert s["weight_versions"] == got["weight_versions"] == [{"version": "step-2", "start": 0, "end": len(want)}], s
assert s["usage"] == got["usage"] and got["usage"]["completion_tokens"] == len(want), s
assert len(got["logprobs"]["token_logprobs"]) == len(want), got["logprobs"]
PY
echo ok
