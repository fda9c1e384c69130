"""Calls out to agents: signed callbacks behind the SSRF guard."""
