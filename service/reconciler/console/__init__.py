"""The operator console: server-rendered pages under ``/console`` for escalations and audit.

``routes`` lists the pages; ``web`` holds the plumbing (session check, forms,
error pages, headers); ``session`` signs cookies and CSRF tokens; the pages
read through ``storage`` and decide through ``commands.decide``.
"""
