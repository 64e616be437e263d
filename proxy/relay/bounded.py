"""A mapping that never holds more than a fixed number of entries.

Whatever the proxy keeps per session, view, part or message is keyed by what peers send, so
without a bound one client (a cache-busting query string, a server with many sessions) could
make it grow for as long as the proxy runs. What is kept is only ever a shortcut or a memory
of what the stream showed: forgetting the least recently used entry costs a look-up, never a
wrong answer.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, ItemsView, Iterator, MutableMapping, ValuesView
from typing import TypeVar, overload

K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")


class Bounded(MutableMapping[K, V]):
    """A dict of at most `capacity` entries: setting a key beyond it forgets the least
    recently set or read one, and hands it to `forgotten` (for what is kept beside it: an index,
    a total; an entry deleted or popped is its taker's to account for). Iteration goes oldest
    first; `in`, `values()` and `items()` refresh nothing: only reading or setting an entry makes
    it the most recent."""

    def __init__(self, capacity: int, *, forgotten: Callable[[K, V], None] | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._forgotten = forgotten
        self._entries: OrderedDict[K, V] = OrderedDict()

    def __getitem__(self, key: K) -> V:
        value = self._entries[key]
        self._entries.move_to_end(key)
        return value

    @overload
    def get(self, key: K, /) -> V | None: ...

    @overload
    def get(self, key: K, /, default: V | T) -> V | T: ...

    def get(self, key: K, /, default: V | T | None = None) -> V | T | None:
        """As `self[key]` when the key is kept (so it refreshes it), without raising when it is
        not: a miss is the common case of some look-ups on the request path."""
        entries = self._entries
        if key not in entries:
            return default
        entries.move_to_end(key)
        return entries[key]

    def peek(self, key: K) -> V | None:
        """The entry of `key`, or None, refreshing nothing."""
        return self._entries.get(key)

    def __setitem__(self, key: K, value: V) -> None:
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            forgotten = self._entries.popitem(last=False)
            if self._forgotten is not None:
                self._forgotten(*forgotten)

    def __delitem__(self, key: K) -> None:
        del self._entries[key]

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[K]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def values(self) -> ValuesView[V]:
        return self._entries.values()

    def items(self) -> ItemsView[K, V]:
        return self._entries.items()

    def clear(self) -> None:
        self._entries.clear()
