"""Group commit: writes queued while one batch is in flight go out together, in order.

Used by the store's SQLite backend (one transaction per batch) and Redis backend (one script
call per session and batch, the sessions' calls pipelined) and by the SQLite broker (one
transaction per batch). Submission order is commit order is
resolution order. A caller that stops waiting does not withdraw its write: it was submitted, so
it commits (or fails) with its batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

__all__ = [
    "WriteQueue",
]

_Op = TypeVar("_Op")


class WriteQueue(Generic[_Op]):
    """Batches submitted operations and sends each batch with `send`.

    `send` returns one result per operation, an exception instance standing for that
    operation's failure; if `send` itself raises, every operation of the batch fails with it.
    """

    def __init__(
        self,
        send: Callable[[Sequence[_Op]], Awaitable[Sequence[Any]]],
        inline: Callable[[Sequence[_Op]], Sequence[Any] | None] | None = None,
    ) -> None:
        self._send = send
        self._inline = inline
        """Sends a batch at once, without waiting, or returns None when it cannot."""
        self._queue: list[tuple[_Op, asyncio.Future[Any]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def submit(self, op: _Op) -> Any:
        """Queue `op`, and return its result once its batch was sent.

        With nothing queued or in flight, an op that `inline` can send at once is sent in the
        caller's task: its turn has come, and nothing it does waits, so no cancellation can
        split it from its result (no future, no flusher task).
        """
        if self._inline is not None and not self._queue and not self._in_flight():
            results = self._inline([op])
            if results is not None:
                (result,) = results
                if isinstance(result, BaseException):
                    raise result
                return result
        (future,) = self._enqueue([op])
        return await future

    async def submit_many(self, ops: Sequence[_Op]) -> list[Any]:
        """Queue `ops` together, in order, and return their results once their batch was sent.

        A result is an exception instance for an operation that failed (each op's own outcome:
        the caller decides what the first failure means for the rest).
        """
        if not ops:
            return []
        return list(await asyncio.gather(*self._enqueue(ops), return_exceptions=True))

    def _enqueue(self, ops: Sequence[_Op]) -> list[asyncio.Future[Any]]:
        """Queue `ops` (one future each) and start a flusher unless one is running."""
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Any]] = [loop.create_future() for _ in ops]
        self._queue.extend(zip(ops, futures, strict=True))
        if not self._in_flight():
            self._flusher = loop.create_task(self._flush())
        return futures

    def _in_flight(self) -> bool:
        return self._flusher is not None and not self._flusher.done()

    async def _flush(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
            try:
                results = await self._send([op for op, _ in batch])
            except BaseException as exc:  # every write of the batch shares the failure
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise
                continue
            for (_, future), result in zip(batch, results, strict=True):
                if future.done():
                    continue
                if isinstance(result, BaseException):
                    future.set_exception(result)
                else:
                    future.set_result(result)

    async def drain(self) -> None:
        """Wait until every submitted operation was sent."""
        while (flusher := self._flusher) is not None and not flusher.done():
            await asyncio.shield(flusher)
