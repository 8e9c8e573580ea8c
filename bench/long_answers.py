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
import tempfile

from store import proxy_on_fake_model, rss_kib


def peak_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmHWM:\s+(\d+)", f.read()).group(1))


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
    config = 'agents: { plain: { system_prompt: "You are terse." } }\nstore: { kind: none }\n'
    print(f"{args.streams} answers at once, each read to its end")
    print("| tokens per answer | bytes streamed per answer | peak RSS over rest, MiB "
          "| KiB per stream |")
    print("|---|---|---|---|")
    for tokens in [int(t) for t in args.tokens.split(",")]:
        body = json.dumps({
            "model": "plain", "stream": True, "max_tokens": tokens,
            "messages": [{"role": "user", "content": "Tell me a long story."}],
        }).encode()

        async def all_streams(port):
            return await asyncio.gather(*[one(port, body) for _ in range(args.streams)])

        # A fresh proxy per length: its peak is this length's.
        with tempfile.TemporaryDirectory() as work, \
                proxy_on_fake_model(bins, work, config) as (port, proxy):
            rest = rss_kib(proxy.pid)
            sizes = asyncio.run(all_streams(port))
            peak = peak_kib(proxy.pid)
        print(f"| {tokens:,} | {sum(sizes) // len(sizes):,} | "
              f"{(peak - rest) / 1024:.1f} | {(peak - rest) / args.streams:.0f} |")


if __name__ == "__main__":
    main()
