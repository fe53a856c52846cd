"""Async MCP client pool (`pool.MCPClientPool`, thread-backed `pool.BackgroundMCPPool`).

Modules: `specs` (ToolSpec, ToolResult, errors), `slots` (one supervised server process + session),
`pool` (routing, calls, the background runner; re-exports everything), `servers` (`ServerSet`: every
server of a run behind one door, each episode's tools), `warm` (a server that writes, as a warm
pool), `copies` (copies of what a server may write). A server is `config.env.MCPServerConfig`.
Nothing is imported here, so `import skyrl_tool_agent.mcp.specs` stays free of the MCP SDK.
"""
