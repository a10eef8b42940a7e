#!/usr/bin/env bash
# Runs `entropyinfer serve` on the shipped model (models/needle-llama-11m, as a Llama 3 chat model)
# and its clients end to end: the official openai package, headless chromium on the chat page and
# raw hostile HTTP (tests/serve/*.test.mjs), one raw `curl -N` SSE stream, and a SIGTERM while a
# stream is in flight, after which the stream must end with [DONE] and the server exit 0.
# Usage: scripts/test_serve.sh [path/to/entropyinfer] (default build/entropyinfer; an ASan build
# works too, several times slower; ENTROPYINFER_HOSTILE_REQUESTS sets the size of the mixed load,
# 1000 by default). Node packages come from npm once and are cached under .cache/npm.
set -euo pipefail
cd "$(dirname "$0")/.."
binary="${1:-build/entropyinfer}"
model=models/needle-llama-11m
context=2048
if [[ ! -x ${binary} ]]; then
  echo "test_serve: no executable at ${binary} (build it, or pass its path)" >&2
  exit 2
fi

work=$(mktemp -d)
log="${work}/server.log"
server_pid=""
cleanup() {
  if [[ -n ${server_pid} ]] && kill -0 "${server_pid}" 2>/dev/null; then
    kill -KILL "${server_pid}" 2>/dev/null || true
  fi
  rm -rf "${work}"
}
trap cleanup EXIT
fail() {
  echo "test_serve: $*" >&2
  echo "--- server log (last 40 lines) ---" >&2
  tail -n 40 "${log}" >&2 || true
  exit 1
}

echo "test_serve: installing the Node clients (tests/serve, cache .cache/npm)"
export npm_config_cache="${PWD}/.cache/npm" PUPPETEER_SKIP_DOWNLOAD=1
(cd tests/serve && npm ci --prefer-offline --no-audit --no-fund --loglevel=error >/dev/null)

# A random key per run; port 0 lets the server pick a free port, which it names on stderr.
api_key="key-$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')"
"${binary}" serve -m "${model}" --chat-format llama3 --port 0 --api-key "${api_key}" \
  --context "${context}" --kv-pool-mib 64 >"${log}" 2>&1 &
server_pid=$!
url=""
for _ in $(seq 1 600); do
  url=$(sed -n 's/^listening on \(http:[^ ]*\)$/\1/p' "${log}")
  [[ -n ${url} ]] && break
  kill -0 "${server_pid}" 2>/dev/null || fail "the server exited before listening"
  sleep 0.1
done
[[ -n ${url} ]] || fail "the server did not start listening within 60 s"
echo "test_serve: server at ${url} (pid ${server_pid})"

export ENTROPYINFER_URL="${url}" ENTROPYINFER_API_KEY="${api_key}" \
  ENTROPYINFER_MODEL=needle-llama-11m ENTROPYINFER_CONTEXT="${context}" \
  ENTROPYINFER_MODEL_DIR="$(pwd)/${model}"
# One file at a time: the hostile test ends by checking that nothing else is running.
if ! (cd tests/serve && node --test --test-concurrency=1 openai_client.test.mjs browser.test.mjs \
  hostile.test.mjs); then
  fail "the Node tests failed"
fi

auth="Authorization: Bearer ${api_key}"
echo "test_serve: curl -N streams a completion"
curl -sSN -H "${auth}" -H "Content-Type: application/json" \
  -d '{"prompt": "Once upon a time", "max_tokens": 5, "stream": true}' \
  "${url}/v1/completions" >"${work}/curl.out" || fail "curl failed"
grep -q '^data: {' "${work}/curl.out" || fail "no SSE data events: $(head -c 300 "${work}/curl.out")"
[[ $(grep -v '^$' "${work}/curl.out" | tail -n 1) == "data: [DONE]" ]] ||
  fail "the stream does not end with 'data: [DONE]'"

echo "test_serve: SIGTERM while a stream is in flight"
curl -sSN -H "${auth}" -H "Content-Type: application/json" \
  -d '{"messages": [{"role": "user", "content": "Tell me everything."}], "max_tokens": 100, "temperature": 1, "stream": true}' \
  "${url}/v1/chat/completions" >"${work}/drain.out" &
curl_pid=$!
# Once its first event arrived the request is in flight.
for _ in $(seq 1 100); do
  grep -q '^data:' "${work}/drain.out" 2>/dev/null && break
  sleep 0.05
done
kill -TERM "${server_pid}"
status=0
for _ in $(seq 1 1200); do
  kill -0 "${server_pid}" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "${server_pid}" 2>/dev/null; then fail "the server did not exit within 120 s of SIGTERM"; fi
wait "${server_pid}" || status=$?
server_pid=""
wait "${curl_pid}" || fail "the in-flight stream failed during shutdown"
((status == 0)) || fail "the server exited with status ${status} after SIGTERM"
grep -q "shutting down" "${log}" || fail "the server did not say it was shutting down"
[[ $(grep -v '^$' "${work}/drain.out" | tail -n 1) == "data: [DONE]" ]] ||
  fail "the in-flight stream was cut off by the shutdown: $(tail -c 300 "${work}/drain.out")"
echo "test_serve: all passed"
