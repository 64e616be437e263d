"""Message views, below the addons: the bytes of a view settled against a liveness reading.

`rewrite`, `scan` and `splice` work on bytes alone; `rewriter` is the pure pipeline over them
(body and reading in, settled body or "unchanged, because" out); `source` is where the reading
comes from (kept from the stream, asked, bounded by what it may vouch for).
"""
