"""Running `opencode serve` as our child: restarts, and the tool processes a crash leaves behind."""
