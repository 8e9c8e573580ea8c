"""The response store's cost: a `previous_response_id` turn against a turn that
re-sends the whole history, the store's own read and write times, and memory.

Runs the bench's fake model (`agent-proxy-bench upstream`) and agent-proxy with
the default store (SQLite beside the config), then, one connection at a time,
CONVERSATIONS conversations of TURNS turns each, twice: chained by
`previous_response_id` (`store: true`), and stateless (`store: false`, every
earlier item sent again). Store times come from the proxy's own
`agent_proxy_store_duration_seconds` histogram (bucket-interpolated).

usage: store.py TARGET_DIR [--store 'YAML'] (run by bench/store.sh)
"""

import argparse
import contextlib
import http.client
import json
import os
import re
import socket
import subprocess
import tempfile
import time

CONVERSATIONS, TURNS = 100, 6


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port):
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on {port}")


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


def histogram_quantile(metrics, op, q, family="agent_proxy_store_duration_seconds",
                       label="op"):
    """Prometheus's histogram_quantile over the series of `family` whose
    `label` is `op`."""
    buckets = []
    for line in metrics.splitlines():
        if not line.startswith(family + "_bucket{") or f'{label}="{op}"' not in line:
            continue
        le = re.search(r'le="([^"]+)"', line).group(1)
        buckets.append((float("inf") if le == "+Inf" else float(le), int(line.split()[-1])))
    if not buckets or buckets[-1][1] == 0:
        return None
    rank, lower, below = q * buckets[-1][1], 0.0, 0
    for upper, count in buckets:
        if count >= rank:
            if upper == float("inf"):
                return lower
            return lower + (upper - lower) * (rank - below) / max(count - below, 1)
        lower, below = upper, count
    return lower


@contextlib.contextmanager
def proxy_on_fake_model(target_dir, work, config):
    """The bench's fake model and agent-proxy on it, with `config` (agents,
    store) after the listener and upstream lines, written into `work`:
    yields the proxy's port and process."""
    up, port = free_port(), free_port()
    upstream = subprocess.Popen([f"{target_dir}/agent-proxy-bench", "upstream", "--listen",
                                 f"127.0.0.1:{up}"])
    path = os.path.join(work, "proxy.yaml")
    with open(path, "w") as f:
        f.write(f"""listen: "127.0.0.1:{port}"
default_upstream: fake
upstreams: {{ fake: {{ url: "http://127.0.0.1:{up}/v1" }} }}
{config}""")
    proxy = subprocess.Popen([f"{target_dir}/agent-proxy", path],
                             env=dict(os.environ, RUST_LOG="warn"))
    try:
        wait_port(up)
        wait_port(port)
        yield port, proxy
    finally:
        proxy.terminate()
        proxy.wait()
        upstream.terminate()
        upstream.wait()


def timed_post(conn, path, body):
    """POSTs `body` on `conn`: the answer's JSON and the seconds it took."""
    start = time.perf_counter()
    conn.request("POST", path, json.dumps(body), {"content-type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    took = time.perf_counter() - start
    if response.status != 200:
        raise SystemExit(f"{response.status}: {data[:300]!r}")
    return json.loads(data), took


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("target_dir")
    parser.add_argument("--store", default="{ kind: sqlite }")
    args = parser.parse_args()

    work = tempfile.mkdtemp()
    config = f"""agents: {{ plain: {{ system_prompt: "You are terse." }} }}
store: {args.store}
"""
    with proxy_on_fake_model(args.target_dir, work, config) as (port, proxy):
        conn = http.client.HTTPConnection("127.0.0.1", port)

        def post(body):
            return timed_post(conn, "/v1/responses", body)

        def ask(turn):
            return f"Question {turn}: " + "tell me more about the previous answer. " * 5

        # Warm-up: connections, the SQLite file, the allocator.
        for _ in range(20):
            post({"model": "plain", "input": ask(0), "store": False})
        rss_before = rss_kib(proxy.pid)
        timings = {"chained": [[] for _ in range(TURNS)], "full history": [[] for _ in range(TURNS)]}
        for _ in range(CONVERSATIONS):
            previous = None
            history = []
            for turn in range(TURNS):
                body = {"model": "plain", "input": ask(turn), "max_output_tokens": 64}
                if previous:
                    body["previous_response_id"] = previous
                answer, took = post(body)
                previous = answer["id"]
                timings["chained"][turn].append(took)

                history.append({"role": "user", "content": ask(turn)})
                answer, took = post({"model": "plain", "input": history, "store": False,
                                     "max_output_tokens": 64})
                history.extend(answer["output"])
                timings["full history"][turn].append(took)
        rss_after = rss_kib(proxy.pid)
        conn.request("GET", "/metrics")
        metrics = conn.getresponse().read().decode()

        print(f"{CONVERSATIONS} conversations x {TURNS} turns, one connection, store: {args.store}")
        print()
        print("| turn | chained p50 µs | p99 µs | full history p50 µs | p99 µs |")
        print("|---|---|---|---|---|")
        for turn in range(TURNS):
            row = [percentile(timings[mode][turn], p) * 1e6
                   for mode in ("chained", "full history") for p in (50, 99)]
            print(f"| {turn + 1} | " + " | ".join(f"{v:.0f}" for v in row) + " |")
        every = {mode: [t for turn in ts for t in turn] for mode, ts in timings.items()}
        row = [percentile(every[mode], p) * 1e6 for mode in every for p in (50, 99)]
        print("| all | " + " | ".join(f"{v:.0f}" for v in row) + " |")
        print()
        for op in ("write", "read"):
            p50, p99 = (histogram_quantile(metrics, op, q) for q in (0.5, 0.99))
            if p50 is not None:
                print(f"store {op}: p50 {p50 * 1e6:.0f} µs, p99 {p99 * 1e6:.0f} µs")
        stored = CONVERSATIONS * TURNS
        print(f"RSS: {rss_before} KiB before, {rss_after} KiB after {stored} stored responses")
        sqlite = os.path.join(work, "agent-proxy.sqlite3")
        if os.path.exists(sqlite):
            size = sum(os.path.getsize(sqlite + s) for s in ("", "-wal", "-shm")
                       if os.path.exists(sqlite + s))
            print(f"SQLite file: {size // 1024} KiB ({size // stored} bytes per response)")


if __name__ == "__main__":
    main()
