"""Talking to opencode: its routes, its API client, its liveness, its event stream, its ids and
JSON, and the other processes that share its database."""
