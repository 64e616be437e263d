"""Message views, below the addons: the bytes of a view settled against a liveness reading.

`message_views` owns the sequence (the stream's word, the bytes, a kept or fresh reading, the
rewrite, what is held back) and the last rewrite of each view; `scan`, `splice` and `rewrite`
work on bytes alone.
"""
