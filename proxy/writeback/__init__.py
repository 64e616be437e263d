"""Durable write-back: scheduling settled ids, and writing them through the server's API or
straight into its SQLite database."""
