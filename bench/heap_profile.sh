#!/usr/bin/env bash
# Where an open stream's memory goes: agent-proxy under heaptrack with N slow
# streams open through each path (agent, passthrough, pingora's own proxy
# path), then the heap at the peak per stream, by call site, into
# bench/results/profile/memory-<path>.md. heaptrack sees only malloc, so the
# proxy is built with the system allocator (into target/system-alloc).
# Needs: heaptrack (apt-get install heaptrack).
#   bash bench/heap_profile.sh [streams, default 1000]
set -euo pipefail
cd "$(dirname "$0")/.."
streams=${1:-1000}
out=bench/results/profile
mkdir -p "$out"
cargo build --release -q -p agent-proxy --no-default-features --features pdf --target-dir target/system-alloc
cargo build --release -q -p agent-proxy-bench
bin=$PWD/target/system-alloc/release/agent-proxy
work=$(mktemp -d)
upstream=
trap 'kill $upstream 2>/dev/null || true; rm -rf "$work"' EXIT

up=18320 px=18321
target/release/agent-proxy-bench upstream --listen "127.0.0.1:$up" 2>"$work/upstream.log" &
upstream=$!
cat > "$work/proxy.yaml" <<CONF
listen: "127.0.0.1:$px"
default_upstream: fake
upstreams:
  fake: { url: "http://127.0.0.1:$up/v1" }
agents:
  plain: { system_prompt: "You are terse." }
limits:
  max_streams_per_client: 100000
store: { kind: none }
CONF
rss() { awk '/VmRSS/{print $2}' "/proc/$1/status"; }

for scenario in agent passthrough pingora; do
  case $scenario in
    agent) model=plain path=/v1/chat/completions framing= ;;
    passthrough) model=other path=/v1/chat/completions framing= ;;
    # Another path than the front doors, its body chunked: pingora's proxy
    # path, no agent-proxy code on the way.
    pingora) model=other path=/v1/completions framing=chunked ;;
  esac
  RUST_LOG=warn heaptrack -o "$work/$scenario" "$bin" --config "$work/proxy.yaml" >"$work/heaptrack.log" 2>&1 &
  tracer=$!
  for _ in $(seq 100); do
    proxy=$(pgrep -f "^$bin --config $work/proxy.yaml" || true)
    [ -n "$proxy" ] && (exec 3<>"/dev/tcp/127.0.0.1/$px") 2>/dev/null && break
    sleep 0.1
  done
  before=$(rss "$proxy")
  python3 bench/open_streams.py "$streams" "$model" "$px" 3 "$path" $framing >"$work/streams.log" &
  opener=$!
  until grep -q open "$work/streams.log"; do sleep 0.1; done
  sleep 0.5
  open=$(rss "$proxy")
  wait $opener
  kill -INT "$proxy"
  wait $tracer
  heaptrack_print -f "$work/$scenario.zst" --flamegraph-cost-type peak -F "$work/$scenario.folded" >/dev/null
  {
    echo "# $scenario: $streams open streams"
    echo
    echo "RSS $before KiB before, $open KiB with the streams open: $(( (open - before) / streams )) KiB per stream."
    echo
    python3 bench/heap_buckets.py "$work/$scenario.folded" "$streams"
  } >"$out/memory-$scenario.md"
  echo "$scenario: $(( (open - before) / streams )) KiB RSS per stream"
done
