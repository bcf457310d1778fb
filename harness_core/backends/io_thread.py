"""One thread per resource for its blocking calls, and the one close/cancel discipline (D191).

A SQLite file or a directory of session files is used from one thread, one call at a time, in
submission order; the event loop never waits for it. The rules every backend that blocks
follows, written once:

* A call whose caller is cancelled before the thread started it is withdrawn: it never runs.
  Once started it runs to its end (nothing interrupts a thread), and the thread counts as
  `busy` until then, whatever happened to its caller: the loop uses the resource itself only
  while nothing runs on the thread.
* `close` refuses every later call at once with the owner's error, lets every call submitted
  before it finish, runs its last work (closing a connection) on the thread, and stops the
  thread, all without blocking the loop. A second `close` waits for the first; a `close` whose
  caller is cancelled still completes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

__all__ = [
    "IoThread",
]

_T = TypeVar("_T")


def _nothing() -> None:
    return None


class IoThread:
    """Runs blocking calls on one thread, in submission order (see the module docstring).

    `closed_error` builds the exception a call after `close` raises (the owner's "closed" error).
    """

    def __init__(self, name: str, closed_error: Callable[[], Exception]) -> None:
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        """The thread (tests watch what is submitted to it)."""
        self._closed_error = closed_error
        self._running = 0
        """Calls submitted and not yet finished (or withdrawn) on the thread."""
        self._closing: asyncio.Task[None] | None = None

    @property
    def closed(self) -> bool:
        """Whether `close` was called (every call since raised the owner's error)."""
        return self._closing is not None

    @property
    def busy(self) -> bool:
        """Whether a submitted call has not finished on the thread yet."""
        return self._running > 0

    async def call(self, fn: Callable[[], _T]) -> _T:
        """Run `fn` on the thread after every call submitted before it; its result or error.

        Raises:
            Exception: the owner's closed error once `close` was called; else what `fn` raised.
        """
        if self._closing is not None:
            raise self._closed_error()
        return await self._submit(fn)

    async def _submit(self, fn: Callable[[], _T]) -> _T:
        loop = asyncio.get_running_loop()
        future = self.pool.submit(fn)
        self._running += 1

        def finished(_: Future[_T]) -> None:
            # on the thread (or here, if withdrawn or already done); registered before the
            # caller's wake-up below, so `busy` is false by the time the caller resumes
            if not loop.is_closed():
                loop.call_soon_threadsafe(self._finished)

        future.add_done_callback(finished)
        return await asyncio.wrap_future(future, loop=loop)

    def _finished(self) -> None:
        self._running -= 1

    async def close(self, last: Callable[[], None] | None = None) -> None:
        """Refuse new calls, let the submitted ones finish, run `last` on the thread, stop it.

        Idempotent: a later call waits for the first one's work (its `last` is ignored).

        Raises:
            Exception: what `last` raised (the thread is stopped all the same).
        """
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._shut(last or _nothing))
        await asyncio.shield(self._closing)

    async def _shut(self, last: Callable[[], None]) -> None:
        try:
            await self._submit(last)  # after every call submitted before (one thread, FIFO)
        finally:
            self.pool.shutdown(wait=True)  # nothing is left to wait for: this returns at once
