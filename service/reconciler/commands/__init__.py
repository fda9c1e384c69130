"""What the doors do, shared so they cannot drift: the agent's actions (``agent_actions``)
over the write actions (one transaction each), with the checks of what callers send
(``validation``); and every read a door makes of the database, named for what it reads
(``operator_reads``, ``inbox_reads``, ``provider_reads``, ``tokens``, ``database``). The
HTTP API, the MCP tools, the console and the CLI call these; none of them calls another
door, nor storage (``tests/unit/test_import_direction.py``).
"""
