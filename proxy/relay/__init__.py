"""The generic reverse proxy: forwarding, headers, codings, event streams, WebSockets, and the hooks
addons attach to. It knows HTTP, not opencode."""
