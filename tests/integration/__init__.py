"""Integration tests: real components together, real local servers, child Python processes (see tests/README.md)."""
