"""Closes an HTTP connection whose request head does not arrive in time (a slowloris defence).

uvicorn bounds the idle time between requests (``timeout_keep_alive``), but nothing bounds a
connection that opens and sends nothing, or sends part of a request head and stops: each is
held for good, and twenty thousand of them took every file descriptor of the process, so
`/healthz`, every channel and the operator page failed, with nothing in the log.
`HeadTimedProtocol` is uvicorn's h11 protocol with one timer more: from the connection's start,
and from the first byte of each later request, the whole head must arrive within
`HEAD_TIMEOUT_S`. Bodies are timed by `gateway.guards.BodyLimit` as routes read them (D386).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from gateway.logs import event

__all__ = ["HEAD_TIMEOUT_S", "HeadTimedProtocol"]

log = logging.getLogger("gateway.http")

HEAD_TIMEOUT_S = 20.0
"""How long a request head may take, from the connection or the request's first byte (nginx's
``client_header_timeout`` is 60 s; Apache's ``RequestReadTimeout`` header is 20-40 s)."""
_SAY_EVERY_S = 60.0
"""How often the log says that connections were closed for slow heads (with how many)."""


class _Tally:
    """Connections closed for a slow head since it was last said (shared by every connection)."""

    closed = 0
    said_at = 0.0


class HeadTimedProtocol(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request head is late."""

    head_timeout_s = HEAD_TIMEOUT_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Accept the connection; its first request's head is timed from now."""
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        """Read as uvicorn does; time a head that begins here, stop timing one that ended."""
        if self._head_timer is None and self.conn.their_state is h11.IDLE:
            self._arm()  # a later request on a kept-alive connection: its head is timed too
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        """Forget the timer, then end as uvicorn does."""
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _too_slow(self) -> None:
        self._head_timer = None
        if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
            return
        self.transport.close()
        _Tally.closed += 1
        now = time.monotonic()
        if now - _Tally.said_at >= _SAY_EVERY_S:
            log.warning(
                event(
                    "http connections closed: no request head in time",
                    closed=_Tally.closed,
                    timeout_s=self.head_timeout_s,
                )
            )
            _Tally.closed, _Tally.said_at = 0, now
