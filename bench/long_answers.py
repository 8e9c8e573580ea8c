"""Memory of long streamed answers: the proxy's peak RSS while STREAMS answers
of TOKENS tokens each stream at once, as fast as the model writes them, each
read to its end by its client.

Runs the bench's fake model (`agent-proxy-bench upstream`, tokens of 4 bytes)
and agent-proxy, an agent without tools of its own in front of it, then opens
the streams (`POST /v1/chat/completions`), once per token count, each time in
a fresh proxy: its `VmHWM` (peak resident memory) over its RSS at rest is what
the answers cost. A proxy that holds an answer whole while it streams needs
more the longer the answer; one that relays it, the same for any length.

usage: python3 bench/long_answers.py TARGET_DIR [--streams N] [--tokens T,T,...]
TARGET_DIR holds `agent-proxy` and `agent-proxy-bench` (e.g. target/release).
"""

import argparse
import asyncio
import json
import os
import re
import socket
import subprocess
import tempfile
import time


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


def status_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(field + r":\s+(\d+)", f.read()).group(1))


async def one(port, body):
    """One answer read to its end; how many bytes it was."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    writer.write(head + body)
    await writer.drain()
    total = 0
    while chunk := await reader.read(1 << 16):
        total += len(chunk)
    writer.close()
    return total


def main():
    args = argparse.ArgumentParser()
    args.add_argument("target_dir")
    args.add_argument("--streams", type=int, default=100)
    args.add_argument("--tokens", default="10000,100000,300000")
    args = args.parse_args()
    bins = os.path.abspath(args.target_dir)
    up, px = free_port(), free_port()
    model = subprocess.Popen(
        [f"{bins}/agent-proxy-bench", "upstream", "--listen", f"127.0.0.1:{up}"],
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(up)
        with tempfile.TemporaryDirectory() as work:
            config = os.path.join(work, "proxy.yaml")
            with open(config, "w") as f:
                f.write(
                    f'listen: "127.0.0.1:{px}"\ndefault_upstream: fake\n'
                    f'upstreams:\n  fake: {{ url: "http://127.0.0.1:{up}/v1" }}\n'
                    'agents:\n  plain: { system_prompt: "You are terse." }\n'
                    "store: { kind: none }\n"
                )
            print(f"{args.streams} answers at once, each read to its end")
            print("| tokens per answer | bytes streamed per answer | peak RSS over rest, MiB "
                  "| KiB per stream |")
            print("|---|---|---|---|")
            for tokens in [int(t) for t in args.tokens.split(",")]:
                proxy = subprocess.Popen(
                    [f"{bins}/agent-proxy", "--config", config],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    env={**os.environ, "RUST_LOG": "warn"},
                )
                try:
                    wait_port(px)
                    rest = status_kib(proxy.pid, "VmRSS")
                    body = json.dumps({
                        "model": "plain", "stream": True, "max_tokens": tokens,
                        "messages": [{"role": "user", "content": "Tell me a long story."}],
                    }).encode()

                    async def all_streams():
                        return await asyncio.gather(
                            *[one(px, body) for _ in range(args.streams)])

                    sizes = asyncio.run(all_streams())
                    peak = status_kib(proxy.pid, "VmHWM")
                finally:
                    proxy.terminate()
                    proxy.wait()
                print(f"| {tokens:,} | {sum(sizes) // len(sizes):,} | "
                      f"{(peak - rest) / 1024:.1f} | {(peak - rest) / args.streams:.0f} |")
    finally:
        model.terminate()
        model.wait()


if __name__ == "__main__":
    main()
