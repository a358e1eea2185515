"""The official MCP Python SDK client against `toolloop serve --mcp` (run by serve_mcp.rs).

usage:
  mcp_client.py stdio TOOLLOOP_BIN ARGS_JSON ENV_JSON [MODE]
  mcp_client.py http URL TOKEN [MODE]

Lists the tools, runs the agent's tool with a progress callback, and, when ELICIT is set in the
environment, answers elicitations (approving when ELICIT is "yes"). Prints one JSON line of what
it saw; any failure raises (exit code 1). MODE is the SDK's connect mode (auto, legacy).
CALL_TOOL and CALL_ARGS (JSON) name another tool to call and its arguments.
With CONCURRENT=N, the first tool is called N times at once, and each result is kept.
With CANCEL_AFTER=SECONDS, the call is abandoned after that long (the SDK then sends
`notifications/cancelled`), and the client waits a second before it closes.
"""

import asyncio
import json
import os
import sys

import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client


async def main():
    kind = sys.argv[1]
    seen = {"progress": [], "elicitations": []}
    if kind == "stdio":
        binary, args, env = sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
        mode = sys.argv[5] if len(sys.argv) > 5 else "auto"
        server = StdioServerParameters(command=binary, args=args, env=env)
    else:
        url, token = sys.argv[2], sys.argv[3]
        mode = sys.argv[4] if len(sys.argv) > 4 else "auto"
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
        server = streamable_http_client(url, http_client=http)

    async def on_progress(progress, total, message):
        seen["progress"].append(message)

    async def on_elicit(context, params):
        seen["elicitations"].append(params.message)
        approve = os.environ.get("ELICIT") == "yes"
        return types.ElicitResult(action="accept", content={"approve": approve})

    elicit = on_elicit if os.environ.get("ELICIT") else None
    async with Client(server, mode=mode, elicitation_callback=elicit, read_timeout_seconds=60) as client:
        seen["protocol"] = client.protocol_version
        tools = await client.list_tools()
        seen["tools"] = [
            {"name": t.name, "description": t.description, "input": t.input_schema, "output": t.output_schema}
            for t in tools.tools
        ]
        cancel_after = os.environ.get("CANCEL_AFTER")
        if cancel_after:
            try:
                await client.call_tool(
                    tools.tools[0].name,
                    {"task": "Look around."},
                    read_timeout_seconds=float(cancel_after),
                    progress_callback=on_progress,
                )
                seen["cancelled"] = False
            except Exception as e:  # the SDK's timeout error
                seen["cancelled"] = type(e).__name__
            await asyncio.sleep(1.0)
            print(json.dumps(seen))
            return
        concurrent = int(os.environ.get("CONCURRENT") or "0")
        if concurrent:
            async def one():
                r = await client.call_tool(tools.tools[0].name, {"task": "Look around."})
                return {
                    "is_error": bool(r.is_error),
                    "text": [c.text for c in r.content if getattr(c, "type", "") == "text"],
                }

            seen["concurrent"] = await asyncio.gather(*[one() for _ in range(concurrent)])
            print(json.dumps(seen))
            return
        name = os.environ.get("CALL_TOOL") or tools.tools[0].name
        arguments = json.loads(os.environ.get("CALL_ARGS") or '{"task": "Look around."}')
        result = await client.call_tool(name, arguments, progress_callback=on_progress)
        seen["is_error"] = bool(result.is_error)
        seen["text"] = [c.text for c in result.content if getattr(c, "type", "") == "text"]
        seen["structured"] = result.structured_content
    print(json.dumps(seen))


asyncio.run(main())
