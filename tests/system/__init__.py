"""System tests: the hubgrpo command, examples, benchmarks and a browser, as a user runs them (see tests/README.md)."""
