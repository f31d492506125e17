"""A verifiers task's tool servers (``vf.Toolset``), served in-process for the verifiers adapter.

verifiers launches each toolset as an MCP server (a subprocess, or in a container) and its harness lists
and calls the tools over MCP, naming each ``<server>_<tool>``. Here each toolset registers its tools on an
in-process ``mcp`` server (the same ``MCPServer`` its own ``_serve`` builds) that is listed and called
directly: same names, descriptions, JSON schemas, argument validation and result content, no subprocess and
no port. Only toolsets verifiers would run on the local machine anyway (the default ``subprocess`` runtime,
no ``url``) are served; the rest are refused (``problem``).
"""

from __future__ import annotations

from typing import Any

from rz_agents.envs.base import ToolSpec


def problem(toolset: Any) -> str | None:
    """Why ``toolset`` cannot be served in-process, or None."""
    from verifiers.v1.mcp import Toolset
    from verifiers.v1.runtimes import SubprocessConfig

    name = type(toolset).__name__
    if not isinstance(toolset, Toolset):
        return f"its tool server {name} is not a vf.Toolset"
    config = toolset.config
    if getattr(config, "url", None):
        return (
            f"its toolset {name} is a remote MCP server ({config.url}), which the adapter does not connect to"
        )
    runtime = getattr(config, "runtime", None)
    if runtime is not None and not isinstance(runtime, SubprocessConfig):
        return (
            f"its toolset {name} runs in a {type(runtime).__name__} runtime (a sandbox), which the adapter "
            "does not run; only local (subprocess-runtime) toolsets are served, in-process"
        )
    return None


class ToolServers:
    """The toolsets of one episode (or of a taskset, for its lifetime), listed and called in-process.

    Every method is a coroutine: run them on one event loop (what a toolset opens in ``setup`` lives there).
    """

    def __init__(self) -> None:
        self.specs: list[ToolSpec] = []
        self._dispatch: dict[str, tuple[Any, str]] = {}  # full name -> (MCPServer, the tool's own name)
        self._toolsets: list[Any] = []

    async def add(self, toolsets: list[Any], task_data: Any = None) -> None:
        """Set up ``toolsets`` (``setup``, then ``setup_task(task_data)`` when given) and list their tools."""
        from mcp.server.mcpserver import MCPServer

        for toolset in toolsets:
            self._toolsets.append(toolset)
            await toolset.setup()
            if task_data is not None:
                await toolset.setup_task(task_data)
            server = MCPServer(toolset.server_name or type(toolset).__name__)
            toolset.register(server)
            prefix = toolset.server_name
            for tool in await server.list_tools():
                full = f"{prefix}_{tool.name}" if prefix else tool.name
                if full in self._dispatch:
                    raise ValueError(f"duplicate tool name {full!r} across the task's toolsets")
                self._dispatch[full] = (server, tool.name)
                self.specs.append(
                    {
                        "type": "function",
                        "function": {
                            "name": full,
                            "description": tool.description or "",
                            "parameters": tool.input_schema,
                        },
                    }
                )

    def __contains__(self, name: str) -> bool:
        return name in self._dispatch

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        """The text result of one call; a tool's own error comes back as text (the episode goes on)."""
        from mcp.server.mcpserver.exceptions import ToolError
        from verifiers.v1.harnesses.utils.mcp import mcp_content_to_chat_content

        server, raw = self._dispatch[name]
        try:
            result = await server.call_tool(raw, arguments)
        except ToolError as exc:
            return f"Error: {exc}"
        content = mcp_content_to_chat_content(result.content)
        if not isinstance(content, str):  # image parts: only their text reaches a text policy
            content = "\n".join(p.get("text", "[image]") for p in content)
        return f"Error: {content}" if getattr(result, "is_error", False) else content

    async def close(self) -> None:
        """Release what the toolsets opened (their exit stacks), newest first."""
        toolsets, self._toolsets = self._toolsets, []
        self.specs, self._dispatch = [], {}
        for toolset in reversed(toolsets):
            await toolset._exit_stack.aclose()
