"""reconciler: exactly one verified answer for long-running remote jobs."""

__version__ = "0.1.0"
