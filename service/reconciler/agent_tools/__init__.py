"""The agent tools over MCP: one tool set, served in the app at ``/mcp`` and over stdio."""
