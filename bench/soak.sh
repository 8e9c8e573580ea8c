#!/usr/bin/env bash
# Soak: steady load on the agent path (streaming a real llama.cpp stream
# with usage, served by nginx) and on passthrough, sampling the proxy's RSS
# every minute. Memory that only grows is a leak.
# Needs: nginx and wrk (apt-get install nginx-light wrk), a release build.
#   bash bench/soak.sh [minutes, default 20]
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-20}
cargo build --release -q
source bench/lib.sh
up=18110 px=18797
# nginx caps a literal at 4 KB: this capture fits.
start_upstream $up text/event-stream "$(cat tests/fixtures/llama.cpp/usage-stream.sse)"
start_proxy $up $px 'a: { system_prompt: "You are terse." }'
agent=$(chat_script agent '{"model":"a","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}')
check=$(curl -sS -N -X POST -H 'content-type: application/json' -d '{"model":"a","stream":true,"messages":[{"role":"user","content":"hi"}]}' "http://127.0.0.1:$px/v1/chat/completions")
grep -q 'data: \[DONE\]' <<<"$check" || { echo "the agent stream is broken: $check" >&2; exit 1; }

rss() { awk '/VmRSS/{print $2}' "/proc/$proxy/status"; }
echo "minute,rss_kib,agent_streams_per_s,agent_non2xx,passthrough_req_per_s"
echo "0,$(rss),,,"
for minute in $(seq 1 "$minutes"); do
  out=$(wrk -t1 -c8 -d50s -s "$agent" "http://127.0.0.1:$px/v1/chat/completions")
  pass=$(wrk -t1 -c8 -d10s "http://127.0.0.1:$px/v1/embeddings" | awk '/Requests\/sec/{print $2}')
  echo "$minute,$(rss),$(awk '/Requests\/sec/{print $2}' <<<"$out"),$(awk '/Non-2xx/{print $5}' <<<"$out" | grep . || echo 0),$pass"
done
echo "warning or error lines in the proxy log: $(grep -c 'WARN\|ERROR' "$work/proxy.log" || true), by message:"
sed 's/\x1b\[[0-9;]*m//g' "$work/proxy.log" | grep 'WARN\|ERROR' | cut -d' ' -f3- | cut -c1-160 | sort | uniq -c | sort -rn | head -5
