"""What the doors do, shared so they cannot drift: the agent's actions (``agent_actions``)
over the write actions (one transaction each), with the checks of what callers send
(``validation``). The HTTP API, the MCP tools, the console and the CLI call these; none
of them calls another door.
"""
