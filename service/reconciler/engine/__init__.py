"""The background half: the worker, the ticker, wake-ups and the steps."""
