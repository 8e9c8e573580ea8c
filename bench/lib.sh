# Shared by the bench scripts: nginx as a fast upstream and the proxy in
# front of it, both cleaned up on exit. Source it, then call:
#   start_upstream PORT CHAT_CONTENT_TYPE 'CHAT_BODY'
#   start_proxy UPSTREAM_PORT PROXY_PORT 'AGENT_YAML'

work=$(mktemp -d)
proxy=
trap 'kill $(cat "$work/nginx.pid" 2>/dev/null) $proxy 2>/dev/null || true; rm -rf "$work"' EXIT

start_upstream() {
  # nginx reads backslash escapes in quoted strings: keep the body's own.
  local body=${3//\\/\\\\}
  cat > "$work/nginx.conf" <<CONF
worker_processes 1;
pid $work/nginx.pid;
error_log $work/error.log;
events { worker_connections 4096; }
http {
  access_log off;
  server {
    listen 127.0.0.1:$1;
    location /v1/ { default_type application/json; return 200 '{"object":"list","data":[{"embedding":[0.1,0.2]}]}'; }
    location = /v1/chat/completions { default_type $2; return 200 '$body'; }
  }
}
CONF
  nginx -c "$work/nginx.conf"
}

start_proxy() {
  cat > "$work/proxy.yaml" <<CONF
listen: "127.0.0.1:$2"
default_upstream: up
upstreams: { up: { url: "http://127.0.0.1:$1/v1" } }
agents: { $3 }
CONF
  RUST_LOG=warn target/release/agent-proxy --config "$work/proxy.yaml" 2>"$work/proxy.log" &
  proxy=$!
  sleep 1
}

# A wrk script POSTing BODY to the chat endpoint: chat_script NAME 'BODY'
chat_script() {
  cat > "$work/$1.lua" <<LUA
wrk.method = "POST"
wrk.body = '$2'
wrk.headers["Content-Type"] = "application/json"
LUA
  echo "$work/$1.lua"
}
