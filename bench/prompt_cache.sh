#!/usr/bin/env bash
# Prompt-cache reuse on a real llama-server, per round and per turn, on each
# front door (see prompt_cache.py for the conversation).
#
# Provisions everything once into ~/.cache/agent-proxy: llama-server built
# from the llama.cpp tree vendored in PyPI's llama-cpp-python sdist (cmake
# through tools/cmake, so none needs installing), numpy and pyyaml for gguf-py, and tiny
# random-weight GGUFs with Qwen2's tokenizer and the chat templates of Qwen3
# (reasoning) and Qwen2.5 (none). The first run builds for ~15 min on 2 cores.
#
#   bash bench/prompt_cache.sh            # table on stdout
#   bash bench/prompt_cache.sh > bench/results/prompt_cache.txt
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
version=0.3.36
cache=${XDG_CACHE_HOME:-$HOME/.cache}/agent-proxy/llama-cpp-python-$version
tree=$cache/llama_cpp_python-$version/vendor/llama.cpp
server=$tree/build/bin/llama-server
mkdir -p "$cache"

if [[ ! -x $server ]]; then
  if [[ ! -d $tree ]]; then
    url=$(curl -fsS https://pypi.org/pypi/llama-cpp-python/$version/json | python3 -c '
import json, sys
print(next(u["url"] for u in json.load(sys.stdin)["urls"] if u["packagetype"] == "sdist"))')
    curl -fsSL "$url" | tar xz -C "$cache"
  fi
  echo "building llama-server (once) ..." >&2
  "$root/tools/cmake" -S "$tree" -B "$tree/build" -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF >&2
  "$root/tools/cmake" --build "$tree/build" --target llama-server -j"$(nproc)" >&2
fi
if [[ ! -x $cache/venv/bin/python ]]; then
  python3 -m venv "$cache/venv"
  "$cache/venv/bin/pip" install -q numpy pyyaml >&2
fi
[[ -x target/release/agent-proxy ]] || cargo build --release >&2

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
llama=
trap '[[ -n $llama ]] && kill $llama 2>/dev/null || true' EXIT
for template in Qwen-Qwen3-0.6B Qwen-Qwen2.5-7B-Instruct; do
  model=$cache/tiny-$template.gguf
  [[ -f $model ]] || PYTHONPATH=$tree/gguf-py "$cache/venv/bin/python" bench/tiny_gguf.py \
    "$tree" "$tree/models/templates/$template.jinja" "$model"
  "$server" -m "$model" --port "$port" -np 1 -c 16384 --cache-ram 0 --jinja >"$cache/llama-server.log" 2>&1 &
  llama=$!
  until curl -fsS "http://127.0.0.1:$port/health" >/dev/null 2>&1; do sleep 0.2; done
  echo "## chat template: $template (llama-server $($server --version 2>&1 | head -1))"
  python3 bench/prompt_cache.py "http://127.0.0.1:$port" target/release/agent-proxy \
    --template "$template"
  echo
  kill $llama; wait $llama 2>/dev/null || true
  llama=
done
