"""HTTP routes: health, the agent API and the provider webhook endpoint."""
