"""Async MCP client pool (`pool.MCPClientPool`, thread-backed `pool.BackgroundMCPPool`).

Modules: `specs` (ServerSpec, ToolSpec, ToolResult, errors), `slots` (one supervised server
process + session), `pool` (routing, calls, the background runner; re-exports everything).
Nothing is imported here, so `import skyrl_tool_agent.mcp.specs` stays free of the MCP SDK.
"""
