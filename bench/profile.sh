#!/usr/bin/env bash
# Where the proxy's CPU goes, at 32 connections: for each hot path a flame
# graph (perf, DWARF call graphs), CPU time and syscalls per request, into
# bench/results/profile/. The upstream is nginx serving real llama-server
# captures, so the proxy is the only Rust process measured.
# Needs: nginx, wrk, perf, strace (apt-get install nginx-light wrk
# linux-perf strace) and inferno (cargo install inferno).
#   bash bench/profile.sh [seconds per scenario, default 8]
set -euo pipefail
cd "$(dirname "$0")/.."
PATH="$PATH:/usr/sbin"
seconds=${1:-8}
out=bench/results/profile
mkdir -p "$out"
cargo build --release -q -p agent-proxy
source bench/lib.sh

up=18310 sse=18311 px=18998
# nginx caps a literal at 4 KB: these captures fit.
json=$(cat tests/fixtures/llama.cpp/plain-nonstream.json)
stream=$(cat tests/fixtures/llama.cpp/usage-stream.sse)
cat > "$work/nginx.conf" <<CONF
worker_processes 1;
pid $work/nginx.pid;
error_log $work/error.log;
events { worker_connections 4096; }
http {
  access_log off;
  server { listen 127.0.0.1:$up;
    location / { default_type application/json; return 200 '${json//\\/\\\\}'; } }
  server { listen 127.0.0.1:$sse;
    location / { default_type text/event-stream; return 200 '${stream//\\/\\\\}'; } }
}
CONF
nginx -c "$work/nginx.conf"
cat > "$work/proxy.yaml" <<CONF
listen: "127.0.0.1:$px"
default_upstream: up
upstreams:
  up: { url: "http://127.0.0.1:$up/v1" }
  sse: { url: "http://127.0.0.1:$sse/v1" }
agents:
  a: { system_prompt: "You are terse." }
  s: { system_prompt: "You are terse.", upstream: sse }
store: { kind: none }
CONF
RUST_LOG=warn target/release/agent-proxy --config "$work/proxy.yaml" 2>"$work/proxy.log" &
proxy=$!
sleep 1

ticks() { awk '{print $14 + $15}' "/proc/$proxy/stat"; }
hz=$(getconf CLK_TCK)
# wrk's request count from its summary.
requests() { awk '/requests in/{print $1}' <<<"$1"; }

echo "| scenario | requests/s | CPU µs per request | syscalls per request | top syscalls per request |" >"$out/table.md"
echo "|---|---|---|---|---|" >>"$out/table.md"
# A coding agent's captured first request, to the agent `a`, not streamed.
coding_agent_script() {
  python3 - "$1" "$work/$2.json" <<'PY'
import json, sys
body = json.load(open(sys.argv[1], encoding="utf-8"))
body = body["body"] if "method" in body else body  # a capture with its head
body.update(model="a", stream=False)
with open(sys.argv[2], "w", encoding="utf-8") as out:
    json.dump(body, out, ensure_ascii=False, separators=(",", ":"))
PY
  cat >"$work/$2.lua" <<LUA
wrk.method = "POST"
wrk.body = io.open("$work/$2.json"):read("*a")
wrk.headers["Content-Type"] = "application/json"
LUA
  echo "$work/$2.lua"
}

for scenario in passthrough agent agent-stream claude-code codex; do
  path=/v1/chat/completions
  case $scenario in
    passthrough) script=$(chat_script "$scenario" '{"model":"m","messages":[{"role":"user","content":"hi"}]}') ;;
    agent) script=$(chat_script "$scenario" '{"model":"a","messages":[{"role":"user","content":"hi"}]}') ;;
    agent-stream) script=$(chat_script "$scenario" '{"model":"s","stream":true,"messages":[{"role":"user","content":"hi"}]}') ;;
    claude-code)
      script=$(coding_agent_script tests/fixtures/clients/claude-code-2.1.330-plain.request.json "$scenario")
      path=/v1/messages ;;
    codex)
      script=$(coding_agent_script tests/fixtures/clients/codex-0.169.0-round1.request.json "$scenario")
      path=/v1/responses ;;
  esac
  url="http://127.0.0.1:$px$path"
  wrk -t1 -c32 -d2s -s "$script" "$url" >/dev/null # warm up
  # CPU per request, with nothing attached to the process.
  before=$(ticks)
  run=$(wrk -t1 -c32 -d"${seconds}s" -s "$script" "$url")
  after=$(ticks)
  n=$(requests "$run")
  rps=$(awk '/Requests\/sec/{printf "%.0f", $2}' <<<"$run")
  cpu_us=$(awk -v t=$((after - before)) -v hz="$hz" -v n="$n" 'BEGIN{printf "%.1f", t / hz * 1e6 / n}')
  # Syscalls per request (strace slows the proxy: only the counts are used).
  strace -c -f -p "$proxy" -o "$work/strace.txt" &
  tracer=$!
  sleep 0.5
  traced=$(requests "$(wrk -t1 -c32 -d3s -s "$script" "$url")")
  kill -INT $tracer
  wait $tracer 2>/dev/null || true
  calls=$(awk '/total/{print $4}' "$work/strace.txt")
  top=$(awk -v n="$traced" '$NF ~ /^[a-z_0-9]+$/ && $NF != "total" && $4 ~ /^[0-9]+$/ {printf "%s %.1f\n", $NF, $4 / n}' "$work/strace.txt" | sort -k2 -rn | head -4 | awk '{printf "%s%s %s", sep, $1, $2; sep=", "}')
  per=$(awk -v c="$calls" -v n="$traced" 'BEGIN{printf "%.1f", c / n}')
  echo "| $scenario | $rps | $cpu_us | $per | $top |" >>"$out/table.md"
  # The flame graph.
  wrk -t1 -c32 -d"$((seconds + 2))s" -s "$script" "$url" >/dev/null &
  load=$!
  sleep 1
  perf record -q -e cpu-clock -F 499 --call-graph dwarf,16384 -p "$proxy" -o "$work/perf.data" -- sleep "$seconds" 2>/dev/null
  wait $load
  perf script -i "$work/perf.data" 2>/dev/null | inferno-collapse-perf --all >"$out/$scenario.folded" # not committed: regenerated
  inferno-flamegraph --title "agent-proxy: $scenario, 32 connections" <"$out/$scenario.folded" >"$out/$scenario.svg"
  python3 bench/profile_buckets.py "$out/$scenario.folded" >"$out/$scenario.buckets.md"
  echo "$scenario: $rps req/s, $cpu_us µs CPU per request, $per syscalls per request"
done
