"""The operating system's view of processes: /proc, process groups, signals, children that must
die with us. It knows nothing of opencode or HTTP."""
