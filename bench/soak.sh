#!/usr/bin/env bash
# Soak: steady load on the agent path (streaming, a real llama.cpp stream
# served by nginx) and on passthrough, for a while, sampling the proxy's
# RSS every minute. Memory that only grows is a leak.
# Needs: nginx and wrk (apt-get install nginx-light wrk), a release build.
#   bash bench/soak.sh [minutes, default 20]
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-20}
cargo build --release -q
work=$(mktemp -d)
proxy=
trap 'kill $(cat "$work/nginx.pid" 2>/dev/null) $proxy 2>/dev/null || true; rm -rf "$work"' EXIT
up=18110 px=18797

# A real llama.cpp stream with a usage chunk (nginx caps a literal at 4 KB).
stream=$(cat tests/fixtures/llama.cpp/usage-stream.sse)
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
    location = /v1/chat/completions { default_type text/event-stream; return 200 '$stream'; }
  }
}
CONF
nginx -c "$work/nginx.conf"
cat > "$work/proxy.yaml" <<CONF
listen: "127.0.0.1:$px"
default_upstream: up
upstreams: { up: { url: "http://127.0.0.1:$up/v1" } }
agents: { a: { system_prompt: "You are terse." } }
CONF
RUST_LOG=warn target/release/agent-proxy --config "$work/proxy.yaml" 2>"$work/proxy.log" &
proxy=$!
sleep 1
cat > "$work/agent.lua" <<'LUA'
wrk.method = "POST"
wrk.body = '{"model":"a","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}'
wrk.headers["Content-Type"] = "application/json"
LUA
rss() { awk '/VmRSS/{print $2}' "/proc/$proxy/status"; }
echo "minute,rss_kib,agent_req_per_s,passthrough_req_per_s"
echo "0,$(rss),,"
for minute in $(seq 1 "$minutes"); do
  agent=$(wrk -t1 -c8 -d50s -s "$work/agent.lua" "http://127.0.0.1:$px/v1/chat/completions" | awk '/Requests\/sec/{print $2}')
  pass=$(wrk -t1 -c8 -d10s "http://127.0.0.1:$px/v1/embeddings" | awk '/Requests\/sec/{print $2}')
  echo "$minute,$(rss),$agent,$pass"
done
grep -ci "error\|panic" "$work/proxy.log" | sed 's/^/error or panic lines in the proxy log: /' || true
