#!/usr/bin/env bash
# Quick latency check: what agent-proxy adds over calling the upstream
# directly. nginx answers fixed JSON as the upstream; wrk measures direct,
# passthrough (pingora's proxy path and a non-agent chat completion) and the
# agent path (an agent without tools), one connection and 32 connections.
# Needs: nginx and wrk (apt-get install nginx-light wrk), a release build.
#   bash bench/quick.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q
source bench/lib.sh
up=18100 px=18787
start_upstream $up application/json '{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}'
start_proxy $up $px 'a: {}'
other=$(chat_script other '{"model":"other","messages":[{"role":"user","content":"hi"}]}')
agent=$(chat_script agent '{"model":"a","messages":[{"role":"user","content":"hi"}]}')

run() { # name connections url [script]
  local out
  out=$(wrk -t"$(( $2 > 1 ? 2 : 1 ))" -c"$2" -d5s --latency ${4:+-s "$4"} "$3")
  printf '| %-32s | %4s | %9s | %9s | %9s |\n' "$1" "$2" \
    "$(awk '/ 50%/{print $2}' <<<"$out")" "$(awk '/ 99%/{print $2}' <<<"$out")" "$(awk '/Requests\/sec/{print $2}' <<<"$out")"
}
echo "| scenario | conns | p50 | p99 | req/s |"
echo "|---|---|---|---|---|"
for c in 1 32; do
  run "direct GET /v1/embeddings" $c "http://127.0.0.1:$up/v1/embeddings"
  run "proxy path GET /v1/embeddings" $c "http://127.0.0.1:$px/v1/embeddings"
  run "direct POST chat" $c "http://127.0.0.1:$up/v1/chat/completions" "$other"
  run "non-agent chat via proxy" $c "http://127.0.0.1:$px/v1/chat/completions" "$other"
  run "agent chat (no tools)" $c "http://127.0.0.1:$px/v1/chat/completions" "$agent"
done
echo "proxy RSS after the run: $(ps -o rss= -p $proxy) KiB"
