"""The demo: fifty mixed operations against the simulated provider, and its report."""
