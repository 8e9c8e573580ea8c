"""What memory injection adds to an agent request: the same chat request to an
agent without memory and to one with `memory: { scope: user }` holding NOTES
notes (the store's read, the block's rendering, a longer upstream body),
interleaved on one connection, with the store's note read time from the
proxy's own `agent_proxy_store_duration_seconds{op="note_read"}`.

usage: memory.py TARGET_DIR (after `cargo build --release --workspace`)
"""

import argparse
import http.client
import os
import sqlite3
import tempfile

from store import histogram_quantile, percentile, proxy_on_fake_model, timed_post

NOTES, REQUESTS = 20, 2000


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("target_dir")
    args = parser.parse_args()

    work = tempfile.mkdtemp()
    # The notes the proxy will find: written as `remember` writes them, for
    # the one identity of a proxy without auth.
    db = sqlite3.connect(os.path.join(work, "agent-proxy.sqlite3"))
    db.execute("""CREATE TABLE notes (id TEXT PRIMARY KEY, owner TEXT NOT NULL,
        agent TEXT NOT NULL, scope TEXT NOT NULL, session TEXT NOT NULL,
        text TEXT NOT NULL, created_at INTEGER NOT NULL)""")
    db.execute("CREATE INDEX notes_owner ON notes (owner)")
    for i in range(NOTES):
        db.execute("INSERT INTO notes VALUES (?, 'anonymous', 'remembering', 'user', '', ?, ?)",
                   (f"mem_{i:016d}", f"Note {i}: the user prefers answers in metric units.", i))
    db.commit()
    db.close()

    config = """agents:
  plain: { system_prompt: "You are terse." }
  remembering: { system_prompt: "You are terse.", memory: { scope: user } }
"""
    with proxy_on_fake_model(args.target_dir, work, config) as (port, _):
        conn = http.client.HTTPConnection("127.0.0.1", port)

        def post(model):
            body = {"model": model, "max_tokens": 64,
                    "messages": [{"role": "user", "content": "What is the weather in Paris?"}]}
            return timed_post(conn, "/v1/chat/completions", body)[1]

        for _ in range(50):
            post("plain")
            post("remembering")
        timings = {"plain": [], "remembering": []}
        for _ in range(REQUESTS):
            for model in timings:
                timings[model].append(post(model))
        conn.request("GET", "/metrics")
        metrics = conn.getresponse().read().decode()

        print(f"{REQUESTS} requests per agent, interleaved, one connection; {NOTES} notes injected")
        print()
        print("| agent | p50 µs | p99 µs |")
        print("|---|---|---|")
        for model, values in timings.items():
            print(f"| {model} | {percentile(values, 50) * 1e6:.0f} | {percentile(values, 99) * 1e6:.0f} |")
        added = [(percentile(timings["remembering"], p) - percentile(timings["plain"], p)) * 1e6
                 for p in (50, 99)]
        print(f"| added by memory | {added[0]:.0f} | {added[1]:.0f} |")
        p50, p99 = (histogram_quantile(metrics, "note_read", q) for q in (0.5, 0.99))
        print()
        print(f"store note read: p50 {p50 * 1e6:.0f} µs, p99 {p99 * 1e6:.0f} µs")


if __name__ == "__main__":
    main()
