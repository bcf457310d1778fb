"""The running-sums arithmetic every backend applies (stats and usage projections)."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import ValidationError

from harness_core.errors import SessionError
from harness_core.messages import Cost, TokenUsage
from harness_core.session.codec import MAX_TOKENS
from harness_core.session.types import SessionStats

__all__ = [
    "USAGE_FIELDS",
    "add_usage",
    "stats_from_counters",
    "usage_from_values",
    "usage_values",
]


USAGE_FIELDS = ("input", "output", "cache_read", "cache_write", "total_tokens")
"""The token counts of a `TokenUsage`, in the order every stored form keeps them (the five cost
amounts follow in the same order, with ``total`` for ``total_tokens``)."""


def usage_values(usage: TokenUsage) -> tuple[int | float, ...]:
    """The five token counts, then the five cost amounts."""
    cost = usage.cost
    return (
        *(getattr(usage, name) for name in USAGE_FIELDS),
        cost.input, cost.output, cost.cache_read, cost.cache_write, cost.total,
    )  # fmt: skip


def usage_from_values(values: Sequence[str | int | float]) -> TokenUsage:
    """The inverse of `usage_values` (stored counters may be strings)."""
    t_in, t_out, t_read, t_write, t_total = (int(v) for v in values[:5])
    c_in, c_out, c_read, c_write, c_total = (float(v) for v in values[5:10])
    cost = Cost(input=c_in, output=c_out, cache_read=c_read, cache_write=c_write, total=c_total)
    return TokenUsage(
        input=t_in,
        output=t_out,
        cache_read=t_read,
        cache_write=t_write,
        total_tokens=t_total,
        cost=cost,
    )


def add_usage(total: TokenUsage, delta: TokenUsage, what: str) -> TokenUsage:
    """`total + delta`, or ``SessionError("invalid_payload")`` if the sum leaves the range.

    Every running sum (the session's, a lane's, an entry's) must stay readable and exact on
    every backend: token sums within ±`MAX_TOKENS`, cost sums finite. A write that would take
    one out of range is refused as a whole, so no sum is ever poisoned.
    """
    try:
        result = total + delta
    except ValidationError:  # a cost sum overflowed to an infinity
        result = None
    if result is not None:
        counts = (
            result.input, result.output, result.cache_read, result.cache_write, result.total_tokens
        )  # fmt: skip
        if min(counts) >= -MAX_TOKENS and max(counts) <= MAX_TOKENS:
            return result
    raise SessionError("invalid_payload", f"the usage sum of {what} would leave the range")


def stats_from_counters(counters: Sequence[str | int | float]) -> SessionStats:
    """Build stats from stored counters.

    The order is: last seq, entries, messages, records, the five token counts (input, output,
    cache read, cache write, total) and the five cost amounts in the same order.
    """
    last, entries, messages, records, *rest = counters
    usage = usage_from_values(rest)
    return SessionStats(
        last_seq=int(last),
        entries=int(entries),
        messages=int(messages),
        records=int(records),
        usage=usage,
    )
