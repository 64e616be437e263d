"""`settle-proxy demo`: the fix shown in a minute, with the opencode installed here, a scripted local
model (no account, no network) and one crash, the call as each client is shown it side by side."""
