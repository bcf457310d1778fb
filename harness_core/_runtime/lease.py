"""The writer-lease keeper: keeps the session's lease alive while the harness has work.

A model request or a tool can run longer than the lease's ttl without writing anything, and a
write after the lease lapsed is refused (`LeaseLost`): without renewal, every long call would
fault the harness. While any lane has work the keeper renews at half-life on the injected
clock (or every `renew_every_ms`: the service's setting). It guards authority (a13n §6.4): when
no renewal has been confirmed and less than a third of the lease remains, new model requests
and tool runs wait until a renewal confirms, and once the lease is past its expiry they never
start; the loss becomes a `lease_lost` event and faults the harness (another process may own the
session now).

Expiries are compared on this process's clock. The backend reports expiries on its own lease
clock (Redis: the server's); the keeper takes the earlier of that and "renewal sent + ttl"
measured locally, so clock skew only ever makes it renew sooner.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from harness_core.clock import Clock
from harness_core.errors import LeaseLost
from harness_core.session.contract import SessionStorage

__all__ = ["LeaseKeeper"]

RETRY_FRACTION = 10
"""A failed renewal (not a loss) is retried after ttl / RETRY_FRACTION."""


class LeaseKeeper:
    """Renews `storage`'s lease while `busy()` and guards paid calls against a lapsing lease.

    `on_lost` is called once, with the `LeaseLost` error, when the lease is gone for good.
    A storage without an expiring lease (read-only, or an OS file lock) needs no keeper: every
    method is then a no-op.
    """

    def __init__(
        self,
        storage: SessionStorage,
        clock: Clock,
        busy: Callable[[], bool],
        on_lost: Callable[[LeaseLost], None],
        on_error: Callable[[BaseException], None],
        renew_every_ms: int | None = None,
    ) -> None:
        self._storage = storage
        self._clock = clock
        self._busy = busy
        self._on_lost = on_lost
        self._on_error = on_error
        lease = storage.lease
        self._ttl = lease.ttl_ms if lease is not None and lease.expires_at_ms else None
        self._every = renew_every_ms if renew_every_ms is not None else (self._ttl or 0) // 2
        """Renew once this much of the lease has passed since the last confirmation."""
        self._expires = lease.expires_at_ms if lease is not None else None
        self._lost: LeaseLost | None = None
        self._changed = asyncio.Event()
        self._idle = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.renewals = 0
        """Confirmed renewals (for tests and metrics)."""

    @property
    def expires_at_ms(self) -> int | None:
        """The newest expiry known to be confirmed (None: the lease does not expire).

        Writes past half-life renew the lease too, but the keeper does not count on them: one
        renewal per half-life is cheap and its confirmation is measured here.
        """
        return self._expires

    def wake(self) -> None:
        """Work started: make sure the renewal loop runs."""
        if self._ttl is None or self._lost is not None:
            return
        self._idle.clear()
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._loop())

    def idle(self) -> None:
        """No lane works any more: the loop stops at once (never inside a renewal)."""
        self._idle.set()

    async def authority(self) -> None:
        """Return when a new paid call may start; raise `LeaseLost` once it never may.

        Immediate while at least a third of the lease remains. Otherwise waits for the renewal
        the keeper is already sending (started here if it was not running).
        """
        if self._ttl is None:
            return
        while True:
            if self._lost is not None:
                raise self._lost
            expires = self.expires_at_ms
            assert expires is not None
            if 3 * (expires - self._clock.now_ms()) >= self._ttl:
                return
            self.wake()
            self._changed.clear()
            await self._changed.wait()

    async def stop(self) -> None:
        """Stop renewing (the harness closes); the lease itself belongs to whoever opened it."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _signal(self) -> None:
        self._changed.set()

    async def _loop(self) -> None:
        assert self._ttl is not None
        ttl = self._ttl
        while self._busy() and self._lost is None:
            now = self._clock.now_ms()
            expires = self.expires_at_ms
            assert expires is not None
            if now >= expires:
                self._lose(LeaseLost(f"the writer lease expired at {expires} without renewal"))
                return
            renew_at = expires - ttl + self._every
            if now < renew_at:
                await self._pause(renew_at - now)
                continue
            sent = now
            try:
                renewed = await self._storage.renew_lease()
            except LeaseLost as exc:
                self._lose(exc)
                return
            except Exception as exc:  # unreachable store: retry until the lease runs out
                self._on_error(exc)
                self._signal()
                await self._pause(max(ttl // RETRY_FRACTION, 1))
                continue
            reported = renewed.expires_at_ms if renewed.expires_at_ms is not None else sent + ttl
            self._expires = max(expires, min(reported, sent + ttl))
            self.renewals += 1
            self._signal()

    async def _pause(self, ms: int) -> None:
        """Sleep `ms` on the injected clock, or less if the harness goes idle."""
        sleeping = asyncio.ensure_future(self._clock.sleep(ms / 1000))
        idle = asyncio.ensure_future(self._idle.wait())
        try:
            await asyncio.wait({sleeping, idle}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeping.cancel()
            idle.cancel()

    def _lose(self, error: LeaseLost) -> None:
        if self._lost is None:
            self._lost = error
            self._on_lost(error)
        self._signal()
