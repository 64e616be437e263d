"""Background work keyed by what it is about: at most one task per key, all owned until closed;
and the one place an application's background work can be waited for."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Hashable, Sequence
from functools import partial
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

K = TypeVar("K", bound=Hashable)
log = logging.getLogger(__name__)


class Idles(Protocol):
    """An owner of background tasks that can say whether any runs, and wait until none does."""

    @property
    def busy(self) -> bool: ...

    async def idle(self) -> None: ...


class Lifecycle(Idles, Protocol):
    """An owner of background tasks that can also cancel them (application cleanup)."""

    async def close(self) -> None: ...


@runtime_checkable
class Working(Protocol):
    """A part of an application that says whether it works in the background: its `tasks`
    (None: it has none), which the application waits for with the rest (`Background`) and the
    part's own `close` ends. An addon is one (`relay.hooks.Addon.tasks`); a part that is no addon
    declares it by being one too, so that what the application waits for is never guessed."""

    tasks: Lifecycle | None


async def _until_idle(owners: Sequence[Idles]) -> None:
    """Wait until no owner is busy: one owner's task can start another's, so once is not enough."""
    while any(owner.busy for owner in owners):
        for owner in owners:
            await owner.idle()


class KeyedTasks(Generic[K]):
    """Confirmations and writes scheduled per session: a second request for a key whose task is
    still under way starts nothing (what it then means is its owner's to say: a confirmation asked
    for meanwhile runs after the one under way, `proxy.addons.live.confirmations.Confirmer`).

    Its owner holds one as `tasks` (composition, never a base class: an addon's `close` is then
    its own, whatever its bases), which `Background` waits for and the owner's cleanup closes.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._tasks: dict[K, asyncio.Task[None]] = {}

    def start(self, key: K, work: Callable[[], Coroutine[Any, Any, None]]) -> bool:
        """Run `work()` for `key` unless a task for `key` is running; say whether it started.
        A task whose work has returned is not running, though its done callbacks are yet to run."""
        if self.running(key):
            return False
        task = asyncio.create_task(work(), name=f"{self._name} {key}")
        self._tasks[key] = task
        task.add_done_callback(partial(self._ended, key))
        return True

    def running(self, key: K) -> bool:
        """Whether the work of `key`'s task is under way."""
        task = self._tasks.get(key)
        return task is not None and not task.done()

    def _ended(self, key: K, task: asyncio.Task[None]) -> None:
        if self._tasks.get(key) is task:
            del self._tasks[key]
        if not task.cancelled() and (error := task.exception()) is not None:
            # Never silent: work that dies on a fault nobody foresaw says so, once.
            log.error("%s of %s failed: %r", self._name, key, error, exc_info=error)

    @property
    def busy(self) -> bool:
        return bool(self._tasks)

    async def idle(self) -> None:
        """Wait until no task runs (tests and the offline command use this)."""
        while self._tasks:
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    async def close(self) -> None:
        """Cancel every task that has not finished (application cleanup)."""
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)


class Together:
    """The background work of several owners, held by one (an addon made of parts) as its own."""

    def __init__(self, *owners: Lifecycle) -> None:
        self._owners = owners

    @property
    def busy(self) -> bool:
        return any(owner.busy for owner in self._owners)

    async def idle(self) -> None:
        await _until_idle(self._owners)

    async def close(self) -> None:
        for owner in self._owners:
            await owner.close()


class Background:
    """Every owner of an application's background tasks, to be waited for as one.

    Tests wait here instead of sleeping. One owner's task can start another's (a confirmation
    schedules a write-back), so waiting goes on until no owner is busy.
    """

    def __init__(self) -> None:
        self._owners: list[Idles] = []

    def add(self, owner: Idles) -> None:
        self._owners.append(owner)

    @property
    def busy(self) -> bool:
        return any(owner.busy for owner in self._owners)

    async def idle(self) -> None:
        await _until_idle(self._owners)
