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
work=$(mktemp -d)
proxy=
trap 'kill $(cat "$work/nginx.pid" 2>/dev/null) $proxy 2>/dev/null || true; rm -rf "$work"' EXIT
up=18100 px=18787

cat > "$work/nginx.conf" <<CONF
worker_processes 1;
pid $work/nginx.pid;
error_log $work/error.log;
events { worker_connections 4096; }
http {
  access_log off;
  server {
    listen 127.0.0.1:$up;
    location /v1/ { default_type application/json; return 200 '{"object":"list","data":[{"embedding":[0.1,0.2]}]}'; }
    location = /v1/chat/completions { default_type application/json; return 200 '{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}'; }
  }
}
CONF
nginx -c "$work/nginx.conf"
cat > "$work/proxy.yaml" <<CONF
listen: "127.0.0.1:$px"
default_upstream: up
upstreams: { up: { url: "http://127.0.0.1:$up/v1" } }
agents: { a: {} }
CONF
RUST_LOG=warn target/release/agent-proxy --config "$work/proxy.yaml" 2>"$work/proxy.log" &
proxy=$!
sleep 1
for model in other a; do
  cat > "$work/$model.lua" <<LUA
wrk.method = "POST"
wrk.body = '{"model":"$model","messages":[{"role":"user","content":"hi"}]}'
wrk.headers["Content-Type"] = "application/json"
LUA
done
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
  run "direct POST chat" $c "http://127.0.0.1:$up/v1/chat/completions" "$work/other.lua"
  run "non-agent chat via proxy" $c "http://127.0.0.1:$px/v1/chat/completions" "$work/other.lua"
  run "agent chat (no tools)" $c "http://127.0.0.1:$px/v1/chat/completions" "$work/a.lua"
done
echo "proxy RSS after the run: $(ps -o rss= -p $proxy) KiB"
