"""Test helpers shared by the unit, integration and fault suites."""
