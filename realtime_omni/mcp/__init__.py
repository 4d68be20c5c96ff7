"""MCP tools: the servers a session names (:mod:`.servers`) and the client that lists and calls
their tools (:mod:`.client`, needs the ``mcp`` extra). The session core turns them into items
and events (:mod:`realtime_omni.session.mcp_control`)."""
