"""nodeagent tests; the importable kit is tests.kit."""
