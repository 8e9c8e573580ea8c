#!/usr/bin/env bash
# Prompt-cache reuse on a real llama-server, per round and per turn, on each
# front door (see prompt_cache.py for the conversation).
#
# llama-server and tiny random-weight GGUFs with Qwen2's tokenizer and the
# chat templates of Qwen3 (reasoning) and Qwen2.5 (none) come from
# tools/llama-server, which builds once into ~/.cache/agent-proxy (~15 min
# on 2 cores the first time).
#
#   bash bench/prompt_cache.sh            # table on stdout
#   bash bench/prompt_cache.sh > bench/results/prompt_cache.txt
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -x target/release/agent-proxy ]] || cargo build --release >&2
log=${XDG_CACHE_HOME:-$HOME/.cache}/agent-proxy/llama-server.log

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
llama=
trap '[[ -n $llama ]] && kill $llama 2>/dev/null || true' EXIT
for template in Qwen-Qwen3-0.6B Qwen-Qwen2.5-7B-Instruct; do
  model=$(tools/llama-server --tiny-model "$template")
  tools/llama-server -m "$model" --port "$port" -np 1 -c 16384 --cache-ram 0 --jinja >"$log" 2>&1 &
  llama=$!
  until curl -fsS "http://127.0.0.1:$port/health" >/dev/null 2>&1; do sleep 0.2; done
  echo "## chat template: $template (llama-server $(tools/llama-server --version 2>&1 | head -1))"
  python3 bench/prompt_cache.py "http://127.0.0.1:$port" target/release/agent-proxy \
    --template "$template"
  echo
  kill $llama; wait $llama 2>/dev/null || true
  llama=
done
