"""Prompt tokens a real llama-server processes per round and per turn.

llama.cpp reuses its KV cache only when a new prompt extends the previous one
token for token. This drives one coding-agent conversation through each of
agent-proxy's front doors and reports, for every upstream request, the prompt
tokens llama-server processed (`timings.prompt_n`) and reused
(`timings.cache_n`).

Between the proxy and llama-server sits a scripted model: each request the
proxy sends is first given to llama-server as is (non-streamed, one token
generated) to measure it, then answered from the script, so the conversation
is the same on every run, while llama-server sees exactly the prompts the
proxy renders.

The conversation (3 rounds, 2 turns), two variants:
  client-tools  turn 1: the model calls the client's Bash twice (the client
                runs it and comes back each time), then answers; turn 2: the
                user thanks, the model answers.
  agent-tool    turn 1: the model calls the agent's own `today` tool (run by
                the proxy, invisible to the client), then the client's Bash,
                then answers; turn 2 as above.

usage: prompt_cache.py LLAMA_SERVER_URL PROXY_BINARY [--template NAME]
Prints a table; with --json, one JSON line per request as well.
"""

import argparse
import json
import os
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LS = '{"description":"List files","command":"ls"}'
CAT = '{"command":"cat a.txt","description":"Read it"}'
ASKS = ["What does a.txt say?", "Thanks"]
RESULTS = ["a.txt", "hi"]

# Each scripted model output: (reasoning, tool call or None, text).
SCRIPTS = {
    "client-tools": [
        ("List first.", ("call_a", "Bash", LS), ""),
        ("Now read it.", ("call_b", "Bash", CAT), ""),
        ("Answer.", None, "a.txt says hi"),
        ("Polite.", None, "Bye"),
    ],
    "agent-tool": [
        ("Check the date.", ("call_t", "today", "{}"), ""),
        ("Now read it.", ("call_b", "Bash", CAT), ""),
        ("Answer.", None, "a.txt says hi"),
        ("Polite.", None, "Bye"),
    ],
}


def post(url, body, headers=None):
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", **(headers or {})},
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


class Model:
    """The scripted model in front of llama-server; records each request."""

    def __init__(self, llama_url):
        self.llama_url = llama_url
        self.script = []
        self.seen = []
        self.lock = threading.Lock()

    def measure(self, body):
        probe = dict(body, stream=False, max_tokens=1)
        probe.pop("stream_options", None)
        timings = post(f"{self.llama_url}/v1/chat/completions", probe)["timings"]
        return timings["prompt_n"], timings.get("cache_n", 0)

    def answer(self, body):
        with self.lock:
            step = len(self.seen)
            processed, reused = self.measure(body)
            self.seen.append((processed, reused))
        reasoning, call, text = self.script[step]
        delta = {"reasoning_content": reasoning}
        chunks = [delta]
        if call:
            cid, name, args = call
            chunks.append({"tool_calls": [{"index": 0, "id": cid, "type": "function",
                                           "function": {"name": name, "arguments": args}}]})
        if text:
            chunks.append({"content": text})
        finish = "tool_calls" if call else "stop"
        return chunks, finish


def handler_for(model):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            self.reply(b'{"object":"list","data":[]}', "application/json")

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            chunks, finish = model.answer(body)
            frame = lambda delta, fin=None: {  # noqa: E731
                "id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1,
                "model": "tiny", "choices": [{"index": 0, "delta": delta, "finish_reason": fin}]}
            events = [frame({"role": "assistant", "content": None})]
            events += [frame(c) for c in chunks] + [frame({}, finish)]
            data = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
            self.reply(data + b"data: [DONE]\n\n", "text/event-stream")

        def reply(self, data, kind):
            self.send_response(200)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def chat(port, _round, state):
    tools = [{"type": "function", "function": {"name": "Bash", "parameters": BASH}}]
    body = {"model": "coder", "messages": state, "tools": tools}
    message = post(f"http://127.0.0.1:{port}/v1/chat/completions", body)["choices"][0]["message"]
    state.append(message)
    return [(c["id"]) for c in message.get("tool_calls") or []]


def responses(port, _round, state):
    tools = [{"type": "function", "name": "Bash", "parameters": BASH}]
    body = {"model": "coder", "input": state, "tools": tools, "store": False,
            "include": ["reasoning.encrypted_content"]}
    output = post(f"http://127.0.0.1:{port}/v1/responses", body)["output"]
    state.extend(output)
    return [item["call_id"] for item in output if item["type"] == "function_call"]


def messages(port, _round, state):
    tools = [{"name": "Bash", "input_schema": BASH}]
    body = {"model": "coder", "max_tokens": 1000, "messages": state, "tools": tools,
            "thinking": {"type": "enabled", "budget_tokens": 500}}
    content = post(f"http://127.0.0.1:{port}/v1/messages", body,
                   {"anthropic-version": "2023-06-01"})["content"]
    state.append({"role": "assistant", "content": content})
    return [b["id"] for b in content if b["type"] == "tool_use"]


BASH = {"type": "object", "properties": {"command": {"type": "string"},
                                          "description": {"type": "string"}}}

# How each front's client says "the user asks" and "here is the result".
FRONTS = {
    "chat": (chat, lambda text: {"role": "user", "content": text},
             lambda cid, out: {"role": "tool", "tool_call_id": cid, "content": out}),
    "responses": (responses, lambda text: {"role": "user", "content": text},
                  lambda cid, out: {"type": "function_call_output", "call_id": cid,
                                    "output": out}),
    "messages": (messages, lambda text: {"role": "user", "content": text},
                 lambda cid, out: {"role": "user", "content": [
                     {"type": "tool_result", "tool_use_id": cid, "content": out}]}),
}


def conversation(port, front):
    """Turn 1 until the model answers (the client running each Bash call),
    then turn 2."""
    send, ask, result = FRONTS[front]
    state = [ask(ASKS[0])]
    for turn in range(2):
        if turn == 1:
            state.append(ask(ASKS[1]))
        results = iter(RESULTS)
        while True:
            calls = send(port, turn, state)
            if not calls:
                break
            for cid in calls:
                state.append(result(cid, next(results)))


CONFIG = """
listen: "127.0.0.1:{port}"
default_upstream: model
upstreams: {{ model: {{ url: "http://127.0.0.1:{model}/v1" }} }}
store: {{ kind: none }}
tools:
  today:
    description: Today's date
    parameters: {{ type: object, properties: {{}} }}
    command: {{ argv: ["echo", "2026-11-24"] }}
agents:
  coder:
    model: tiny
    system_prompt: You are a careful coding assistant. Use tools when they help.
    tools: [today]
"""


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("llama_url")
    parser.add_argument("proxy")
    parser.add_argument("--template", default="")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    model = Model(args.llama_url)
    shim = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(model))
    threading.Thread(target=shim.serve_forever, daemon=True).start()
    port = free_port()
    work = tempfile.mkdtemp()
    config = os.path.join(work, "proxy.yaml")
    with open(config, "w") as f:
        f.write(CONFIG.format(port=port, model=shim.server_address[1]))
    proxy = subprocess.Popen([args.proxy, config], env=dict(os.environ, RUST_LOG="warn"))
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        print(f"{'variant':<13} {'front':<10} {'request':<28} {'processed':>9} {'reused':>7}")
        for variant, script in SCRIPTS.items():
            labels = (["turn 1 round 1", "turn 1 round 2", "turn 1 round 3", "turn 2 round 1"])
            for front in FRONTS:
                model.script, model.seen = script, []
                # A different prompt first, so no run starts warm from the
                # one before (one slot, no host-memory prompt cache).
                post(f"{args.llama_url}/v1/chat/completions",
                     {"messages": [{"role": "user", "content": f"reset {variant} {front}"}],
                      "max_tokens": 1})
                conversation(port, front)
                for label, (processed, reused) in zip(labels, model.seen):
                    print(f"{variant:<13} {front:<10} {label:<28} {processed:>9} {reused:>7}")
                    if args.json:
                        print(json.dumps({"template": args.template, "variant": variant,
                                          "front": front, "request": label,
                                          "processed": processed, "reused": reused}))
    finally:
        proxy.terminate()
        proxy.wait()
        shim.shutdown()


if __name__ == "__main__":
    main()
