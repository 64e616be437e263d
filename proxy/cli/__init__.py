"""The command line: `serve`, `run`, the offline `settle` and `orphans` commands, and `demo`."""
