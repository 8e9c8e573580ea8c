"""A knowledge base of 10,000 chunks: how long it takes to build (embedding
included) and to rebuild from the embeddings cache, the memory it holds, the
time a search takes, what `knowledge_auto` adds to a request, and recall@5 on
a labelled set of questions.

The embedding model is a stand-in served by this script: words hashed into
384 dimensions (a bag of words), deterministic and fast, so the figures are
the proxy's: reading, chunking, the cache, the index and its exact search.
Its chat model answers with the last user message it got, so the passages
`knowledge_auto` put in front of a question can be read back.

With `--postgres URL`, the base's index is a table in that Postgres
(pgvector, HNSW): the build inserts every chunk, the restart is a replica
that finds them all there, the search is Postgres's query, and recall@5
measures the approximate index.

usage: knowledge.py TARGET_DIR [--postgres URL of a fresh database]
(after `cargo build --release --workspace`)
"""

import argparse
import http.client
import json
import os
import random
import re
import socket
import subprocess
import tempfile
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from store import free_port, histogram_quantile, percentile, rss_kib, wait_port

FILES, PARAGRAPHS, WORDS, DIMS = 100, 100, 55, 384
LABELLED, REQUESTS = 50, 500


def embedding(text):
    vector = [0.0] * DIMS
    for word in re.findall(r"[a-z0-9]{3,}", text.lower()):
        vector[zlib.crc32(word.encode()) % DIMS] += 1.0
    return vector


class Model(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    embedded = 0  # inputs embedded so far

    def setup(self):
        super().setup()
        # Headers and body go out in two writes: without this, Nagle holds
        # the body until the proxy's delayed ACK (40 ms).
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.answer({"object": "list", "data": []})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        if self.path.endswith("/embeddings"):
            inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
            Model.embedded += len(inputs)
            self.answer({"object": "list", "data": [
                {"object": "embedding", "index": i, "embedding": embedding(t)}
                for i, t in enumerate(inputs)]})
            return
        last = body["messages"][-1]["content"]
        if isinstance(last, list):
            last = "".join(p.get("text", "") for p in last)
        self.answer({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "echo",
                     "choices": [{"index": 0, "finish_reason": "stop",
                                  "message": {"role": "assistant", "content": last}}],
                     "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

    def answer(self, value):
        data = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def corpus(directory):
    """FILES files of PARAGRAPHS paragraphs (one chunk each), and the
    labelled questions: some words of one paragraph and a little noise."""
    rng = random.Random(7)
    vocabulary = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(4, 9)))
                  for _ in range(5000)]
    paragraphs = []
    for f in range(FILES):
        ours = [" ".join(rng.choice(vocabulary) for _ in range(WORDS)) + "."
                for _ in range(PARAGRAPHS)]
        with open(os.path.join(directory, f"doc{f:03}.md"), "w") as out:
            out.write("\n\n".join(ours) + "\n")
        paragraphs.extend(ours)
    labelled = []
    for target in rng.sample(paragraphs, LABELLED):
        words = target.rstrip(".").split()
        question = rng.sample(words, 8) + [rng.choice(vocabulary) for _ in range(2)]
        labelled.append((" ".join(question), target))
    return labelled


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("target_dir")
    parser.add_argument("--postgres", help="the index in this Postgres (pgvector) instead of embedded")
    args = parser.parse_args()
    index = f', index: {{ kind: postgres, url: "{args.postgres}" }}' if args.postgres else ""

    work = tempfile.mkdtemp()
    docs = os.path.join(work, "docs")
    os.mkdir(docs)
    labelled = corpus(docs)
    model_port, port = free_port(), free_port()
    server = ThreadingHTTPServer(("127.0.0.1", model_port), Model)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = os.path.join(work, "proxy.yaml")
    with open(config, "w") as f:
        f.write(f"""listen: "127.0.0.1:{port}"
default_upstream: model
upstreams: {{ model: {{ url: "http://127.0.0.1:{model_port}/v1" }} }}
knowledge_bases:
  docs: {{ sources: [docs/*.md], chunk: {{ size: 600, overlap: 0 }}, top_k: 5{index} }}
agents:
  plain: {{ system_prompt: "Answer." }}
  reader: {{ system_prompt: "Answer.", knowledge: [docs], knowledge_auto: true }}
""")

    def start():
        proxy = subprocess.Popen([f"{args.target_dir}/agent-proxy", config],
                                 env=dict(os.environ, RUST_LOG="warn"))
        wait_port(port)
        return proxy

    def ready(proxy, started):
        conn = http.client.HTTPConnection("127.0.0.1", port)
        while True:
            conn.request("GET", "/readyz")
            status = json.loads(conn.getresponse().read())["knowledge"]["docs"]
            if status["status"] == "ready":
                return time.perf_counter() - started, status["chunks"]
            if status["status"] == "failed":
                raise SystemExit(f"build failed: {status}")
            time.sleep(0.02)

    started = time.perf_counter()
    proxy = start()
    rss_start = rss_kib(proxy.pid)
    built, chunks = ready(proxy, started)
    rss_ready = rss_kib(proxy.pid)
    if Model.embedded < chunks:
        proxy.terminate()
        raise SystemExit("the index already held chunks: give --postgres a fresh database")
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port)

        def ask(model, question):
            body = {"model": model, "messages": [{"role": "user", "content": question}]}
            begin = time.perf_counter()
            conn.request("POST", "/v1/chat/completions", json.dumps(body),
                         {"content-type": "application/json"})
            response = conn.getresponse()
            data = json.loads(response.read())
            if response.status != 200:
                raise SystemExit(f"{response.status}: {data}")
            return data["choices"][0]["message"]["content"], time.perf_counter() - begin

        found = 0
        for question, target in labelled:
            answer, _ = ask("reader", question)
            found += target[:60] in answer
        timings = {"plain": [], "reader": []}
        for i in range(REQUESTS):
            question = labelled[i % LABELLED][0]
            for model in timings:
                timings[model].append(ask(model, question)[1])
        conn.request("GET", "/metrics")
        metrics = conn.getresponse().read().decode()
    finally:
        proxy.terminate()
        proxy.wait()
    started = time.perf_counter()
    proxy = start()
    rebuilt, _ = ready(proxy, started)
    proxy.terminate()
    proxy.wait()
    server.shutdown()

    quantile = lambda phase, q: histogram_quantile(  # noqa: E731
        metrics, phase, q, family="agent_proxy_knowledge_search_duration_seconds", label="phase")
    where = "in Postgres (pgvector, HNSW)" if args.postgres else "embedded"
    print(f"{chunks} chunks ({FILES} files), {DIMS} dimensions, index {where}, one connection")
    print()
    print(f"- build, embedding every chunk: {built:.1f} s (the stand-in embedding server included)")
    if args.postgres:
        print(f"- build at restart (a replica finding every chunk in the table): {rebuilt:.2f} s")
    else:
        print(f"- rebuild at restart, every chunk from the embeddings cache: {rebuilt:.2f} s")
    print(f"- RSS: {rss_start / 1024:.1f} MiB at start, {rss_ready / 1024:.1f} MiB with the index built")
    print(f"- index search: p50 {quantile('search', 0.5) * 1e6:.0f} µs, p99 {quantile('search', 0.99) * 1e6:.0f} µs; "
          f"query embedding: p50 {quantile('embed', 0.5) * 1e6:.0f} µs")
    added = [(percentile(timings["reader"], p) - percentile(timings["plain"], p)) * 1e6 for p in (50, 99)]
    print(f"- `knowledge_auto` adds p50 {added[0]:.0f} µs, p99 {added[1]:.0f} µs per request "
          f"({REQUESTS} requests each, interleaved)")
    print(f"- recall@5 on {LABELLED} labelled questions: {found / LABELLED:.2f}")


if __name__ == "__main__":
    main()
