"""Opens N slow streaming requests to the proxy and holds them open.

    python3 bench/open_streams.py N MODEL PORT HOLD_SECONDS [PATH [chunked]]

Each asks the bench's fake model (`agent-proxy-bench upstream`) for 10,000
tokens, one every 100 ms, and reads only the first bytes of the answer: the
stream stays open for HOLD_SECONDS. Prints `open N` once all are open.
`chunked` sends the body chunked, its length unsaid: pingora's proxy path is
what forwards such a request for another route.
"""

import asyncio
import json
import sys

count, model, port, hold = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
path = sys.argv[5] if len(sys.argv) > 5 else "/v1/chat/completions"
body = json.dumps(
    {
        "model": model,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 10000,
        "bench_delay_us": 100000,
    }
).encode()
if len(sys.argv) > 6 and sys.argv[6] == "chunked":
    framing = "Transfer-Encoding: chunked"
    body = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
else:
    framing = f"Content-Length: {len(body)}"
head = (
    f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
    f"{framing}\r\n\r\n"
).encode()


async def one():
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head + body)
    await writer.drain()
    first = await reader.read(200)
    if not first.startswith(b"HTTP/1.1 200"):
        raise SystemExit(f"not a 200: {first[:80]!r}")
    return reader, writer


async def main():
    streams = []
    for start in range(0, count, 100):
        streams += await asyncio.gather(*[one() for _ in range(min(100, count - start))])
    print("open", len(streams), flush=True)
    await asyncio.sleep(hold)


asyncio.run(main())
