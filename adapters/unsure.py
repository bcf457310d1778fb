"""How long a reply not found after a send of unknown outcome stays "unknown" before "absent".

A send whose answer was lost (a timeout, a dropped connection after the request went out) may
still land: a mail server's queue files the bot's copy seconds later, and Slack may apply a
post it sat on after the client gave up. A reconcile that reads "absent" too soon sends the
reply a second time. `Unsure` keeps, per delivery, when the doubt began: at the lost send when
this process made it, else (where every doubtful send may land late, as mail does) at the first
look that found nothing (a restart, another process, or a send cut off from outside by the
deliverer's timeout). That needs nothing durable: the window begins at or after the attempt it
covers, in whatever process looks, so a restart only lengthens it (D408).
"""

from __future__ import annotations

from harness_core.clock import Clock

__all__ = ["Unsure"]

_FORGET_MS = 3_600_000
"""A doubt older than this is forgotten (another process settled its delivery meanwhile)."""


class Unsure:
    """Per delivery id, since when its reply's fate is in doubt."""

    def __init__(self, clock: Clock, settle_s: float, *, first_look_begins: bool = True) -> None:
        """`settle_s`: how long after the doubt began a reply not found is "absent".

        `first_look_begins`: a first look for a delivery this process saw no lost send of
        begins a doubt (a mail server's queue may hold any send of unknown outcome); False:
        only `lost` does (the sends this process saw time out).
        """
        self.clock = clock
        self.settle_s = settle_s
        self.first_look_begins = first_look_begins
        self._since: dict[str, int] = {}

    def lost(self, delivery_id: str) -> None:
        """A send of `delivery_id` lost its answer now (an earlier doubt stands)."""
        self._prune()
        self._since.setdefault(delivery_id, self.clock.now_ms())

    def found(self, delivery_id: str) -> None:
        """Its reply was found, or settled: no more doubt."""
        self._since.pop(delivery_id, None)

    def absent(self, delivery_id: str) -> bool:
        """Whether a reply not found now is absent (True), or may yet land (False: look later).

        The first look for a delivery this process has no doubt for begins one, when
        `first_look_begins`; else it is absent.
        """
        if delivery_id not in self._since:
            if not self.first_look_begins:
                return True
            self.lost(delivery_id)
        if self.clock.now_ms() - self._since[delivery_id] < self.settle_s * 1000:
            return False
        self.found(delivery_id)
        return True

    def _prune(self) -> None:
        now = self.clock.now_ms()
        self._since = {d: at for d, at in self._since.items() if now - at < _FORGET_MS}
