"""What every door that answers HTTP shares: who is asking (``auth``), reading a body under
its limit (``bodies``), the error answers (``errors``) and the JSON encoding (``responses``).

Below the doors (``api``, ``console``, ``agent_tools``), so none of them imports another
for these; named for requests coming in, as ``outbound`` is for the calls we make.
"""
