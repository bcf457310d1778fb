"""A dependency's failures, said once as they begin, once a minute while they last, once at the end.

The loops that call the broker (each worker slot's take, the deliverer's claim) retry every
second or so while it is down; a line per failure was about 240 a minute and never said when
it ended (an outside probe). One `Outage` per dependency and process: its parts (``take``,
``claim``) report each failure and each success; the first failure logs a warning with the
reason, a reminder follows each minute while any part still fails (with the count), and the
first moment no part fails logs how long it lasted (D347). A part's success counts only once
`SETTLE_MS` have passed since its last failure: a take that returns without reaching the
server (nothing was due) is no proof it answers, and a command refused each second (an ACL
without XAUTOCLAIM) flapped "unavailable" and "available again" every second (an outside
probe).
"""

from __future__ import annotations

import logging

from gateway.logs import event
from harness_core import Clock

__all__ = ["REMIND_MS", "SETTLE_MS", "Outage"]

REMIND_MS = 60_000
"""How often a lasting outage is said again."""
SETTLE_MS = 5_000
"""How long after a part's last failure its successes count (an outage's end is not a blip)."""

_REASON_CHARS = 300
"""A reason is cut there (the log formatter redacts configured secrets and URL passwords)."""


class Outage:
    """One dependency's failures as seen by its callers in this process."""

    def __init__(
        self,
        what: str,
        clock: Clock,
        logger: logging.Logger,
        *,
        remind_ms: int = REMIND_MS,
        settle_ms: int = SETTLE_MS,
    ) -> None:
        self.what = what
        self._clock = clock
        self._log = logger
        self._remind_ms = remind_ms
        self._settle_ms = settle_ms
        self._failing: dict[str, int] = {}
        """Each failing part, and when it last failed."""
        self.since_ms: int | None = None
        """When the outage began (None: no part fails)."""
        self.failures = 0
        """Failures since it began."""
        self._said_ms = 0

    @property
    def down(self) -> bool:
        """Whether some part's last call failed."""
        return bool(self._failing)

    def failed(self, part: str, exc: BaseException) -> None:
        """`part`'s call failed with `exc`: said if it begins an outage, else each minute."""
        now = self._clock.now_ms()
        self.failures += 1
        self._failing[part] = now
        reason = str(exc)[:_REASON_CHARS] or None
        if self.since_ms is None:
            self.since_ms = self._said_ms = now
            self._log.warning(
                event(
                    f"{self.what} unavailable",
                    part=part,
                    error=type(exc).__name__,
                    code=_code(exc),
                    reason=reason,
                    retrying="said again each minute while it lasts, and when it ends",
                )
            )
        elif now - self._said_ms >= self._remind_ms:
            self._said_ms = now
            self._log.warning(
                event(
                    f"{self.what} still unavailable",
                    seconds=round((now - self.since_ms) / 1000),
                    failures=self.failures,
                    parts=sorted(self._failing),
                    error=type(exc).__name__,
                    code=_code(exc),
                    reason=reason,
                )
            )

    def ok(self, part: str) -> None:
        """`part`'s call worked: the outage ends once no part fails.

        A success within `settle_ms` of the part's last failure does not count yet.
        """
        if self.since_ms is None:
            return
        now = self._clock.now_ms()
        last = self._failing.get(part)
        if last is not None and now - last < self._settle_ms:
            return
        self._failing.pop(part, None)
        if self._failing:
            return
        seconds = (now - self.since_ms) / 1000
        self._log.info(
            event(
                f"{self.what} available again",
                seconds=round(seconds, 1),
                failures=self.failures,
            )
        )
        self.since_ms, self.failures = None, 0


def _code(exc: BaseException) -> str | None:
    """A gateway error's code (``storage``, ``closed``), if it has one."""
    code = getattr(exc, "code", None)
    return code if isinstance(code, str) else None
