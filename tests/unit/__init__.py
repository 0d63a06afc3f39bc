"""Unit tests: in one process, nothing listening, no child processes (see tests/README.md)."""
