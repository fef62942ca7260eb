"""A real MCP server for the `mcp:` env tests (the SDK's `MCPServer`, mcp 2's name for FastMCP).

    cd tests && python -m support.mcp_servers                 # stdio (what the tests start)
    cd tests && python -m support.mcp_servers --http 8765     # streamable HTTP on 127.0.0.1:8765/mcp

Tools: ``lookup(key)`` (a country's capital from a small fixed table; an unknown country is a tool error),
``add(a, b)``, and ``picture()`` (an image part and a text part, to test what the env makes of non-text content).
"""

from __future__ import annotations

import argparse

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ImageContent, TextContent

CAPITALS = {
    "France": "Paris",
    "Japan": "Tokyo",
    "Kenya": "Nairobi",
    "Peru": "Lima",
    "Canada": "Ottawa",
    "Norway": "Oslo",
    "Egypt": "Cairo",
    "Chile": "Santiago",
}

server = MCPServer("roll-lightning-test-tools", log_level="WARNING")


@server.tool(description="The capital city of a country (e.g. lookup('France') -> 'Paris').")
def lookup(key: str) -> str:
    if key not in CAPITALS:
        raise ToolError(f"no entry for {key!r}")  # a tool error the caller sees (not a crash)
    return CAPITALS[key]


@server.tool(description="The sum of two numbers.")
def add(a: float, b: float) -> float:
    return a + b


@server.tool(description="A one-pixel picture with a caption.")
def picture() -> list[ImageContent | TextContent]:
    return [ImageContent(data="iVBORw0KGgo=", mime_type="image/png"), TextContent(text="a red pixel")]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP on 127.0.0.1:PORT/mcp")
    args = parser.parse_args()
    if args.http is None:
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.http)


if __name__ == "__main__":
    main()
