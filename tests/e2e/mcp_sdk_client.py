"""An MCP client no one here wrote: the official Python SDK (PyPI `mcp`).

Usage: mcp_sdk_client.py ONGRID_SKILL SOCKET MODE, MODE `modern` (the SDK's
newest revision: `server/discover`, no handshake) or a handshake revision
such as `2025-06-18` (`initialize` at that version). Starts
`ONGRID_SKILL mcp --socket SOCKET` over stdio, lists the tools, calls `echo`
and `fail`, and prints one JSON object of what it saw, for the test to check.
"""

import json
import sys

import anyio
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client


async def connect(session: ClientSession, mode: str) -> str:
    if mode == "modern":
        await session.discover()
    else:
        params = types.InitializeRequestParams(
            protocol_version=mode,
            capabilities=types.ClientCapabilities(),
            client_info=types.Implementation(name="ongrid-e2e", version="1"),
        )
        result = await session.send_request(types.InitializeRequest(params=params), types.InitializeResult)
        session.adopt(result)
        await session.send_notification(types.InitializedNotification())
    return session.protocol_version


def dump(result: types.CallToolResult) -> dict:
    return {
        "is_error": bool(result.is_error),
        "structured": result.structured_content,
        "text": [c.text for c in result.content if isinstance(c, types.TextContent)],
    }


async def main(binary: str, socket: str, mode: str) -> None:
    server = StdioServerParameters(command=binary, args=["mcp", "--socket", socket])
    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write) as session:
            version = await connect(session, mode)
            tools = await session.list_tools()
            echo = await session.call_tool("echo", {"n": 7})
            fail = await session.call_tool("fail", {})
            print(
                json.dumps(
                    {
                        "version": version,
                        "server": session.server_info.name if session.server_info else None,
                        "tools": sorted(t.name for t in tools.tools),
                        "echo": dump(echo),
                        "fail": dump(fail),
                    }
                )
            )


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:4])
