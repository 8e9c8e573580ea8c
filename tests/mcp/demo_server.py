"""A small MCP server for agent-proxy's tests, on the official `mcp` package.

    python3 demo_server.py stdio
    python3 demo_server.py http PORT     (streamable HTTP at /mcp)
"""

import asyncio
import os
import sys

from mcp.server.mcpserver import Context, Image, MCPServer

server = MCPServer("demo")


@server.tool()
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@server.tool()
def whoami(user_id: str, note: str = "") -> str:
    """Say which user the call is for."""
    return f"user={user_id} note={note}"


@server.tool()
def fail(message: str) -> str:
    """Always fails with the message."""
    raise ValueError(message)


@server.tool()
def crash() -> str:
    """Kills the server process mid-call."""
    os._exit(3)


@server.tool()
def pid() -> str:
    """The server's process id."""
    return str(os.getpid())


@server.tool()
def picture() -> Image:
    """A tiny PNG."""
    return Image(data=b"\x89PNG\r\n\x1a\n", format="png")


@server.tool()
async def slow(seconds: float) -> str:
    """Sleeps, then answers."""
    await asyncio.sleep(seconds)
    return "done"


@server.tool()
def auth(ctx: Context) -> str:
    """The Authorization header of the HTTP request that carried the call."""
    headers = ctx.headers or {}
    return headers.get("authorization", "none")


if __name__ == "__main__":
    if sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
