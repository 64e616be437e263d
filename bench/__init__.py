"""Side-by-side benchmark of settle-proxy against direct access and nginx (see bench/README.md)."""
