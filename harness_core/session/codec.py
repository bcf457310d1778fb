"""The one JSON codec every backend stores through: canonical encodings and checked decodes.

Encodings are canonical (field order is fixed by the models and JSON object keys are sorted
when values are frozen), so two payloads are equal iff their encodings are equal; backends
that cannot compare models (a Redis script) compare encodings. Encoding is also the last gate
before a write: anything that cannot be encoded, or would not decode back to what was given,
raises ``SessionError("invalid_payload")`` before a backend touches durable state. That covers
values that skipped validation (``model_copy(update=...)`` does): a NaN or an infinity, which
pydantic's JSON encoder would silently write as ``null``, and usage amounts that the backends'
running sums cannot hold exactly. Decoding failures raise `StoreCorrupted`.
"""

from __future__ import annotations

import json
from typing import Any, NoReturn, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

from harness_core.errors import SessionError, StoreCorrupted
from harness_core.messages import TokenUsage
from harness_core.session.entries import (
    ActiveToolsChangeEntry,
    BranchSummaryEntry,
    CompactionEntry,
    CustomEntry,
    Entry,
    MessageEntry,
    ModelChangeEntry,
    ThinkingLevelChangeEntry,
)
from harness_core.session.records import (
    AbortRequested,
    ApprovalDecided,
    ApprovalRequested,
    OperationFinished,
    OperationResumed,
    OperationStarted,
    QueueCancelled,
    QueueEnqueued,
    Record,
    StepAttempt,
    ToolStarted,
    Usage,
    WriteDeferred,
)
from harness_core.session.types import Fact, FactSet, LabelFact, LogItem, NameFact, SessionMetadata

__all__ = [
    "ENTRY_TYPES",
    "MAX_TOKENS",
    "RECORD_TYPES",
    "check_usage_amount",
    "decode",
    "decode_entry",
    "decode_log_item",
    "decode_record",
    "encode",
    "encode_entry",
    "encode_fact",
    "encode_log_item",
    "encode_record",
    "entry_adapter",
    "fact_adapter",
    "log_item_adapter",
    "record_adapter",
]

ENTRY_TYPES: tuple[type[BaseModel], ...] = (
    MessageEntry,
    ModelChangeEntry,
    ThinkingLevelChangeEntry,
    ActiveToolsChangeEntry,
    CompactionEntry,
    BranchSummaryEntry,
    CustomEntry,
)
RECORD_TYPES: tuple[type[BaseModel], ...] = (
    OperationStarted,
    AbortRequested,
    OperationFinished,
    StepAttempt,
    ToolStarted,
    QueueEnqueued,
    QueueCancelled,
    WriteDeferred,
    Usage,
    ApprovalRequested,
    ApprovalDecided,
    OperationResumed,
)

entry_adapter: TypeAdapter[Entry] = TypeAdapter(Entry)
record_adapter: TypeAdapter[Record] = TypeAdapter(Record)
fact_adapter: TypeAdapter[Fact] = TypeAdapter(Fact)
log_item_adapter: TypeAdapter[LogItem] = TypeAdapter(LogItem)

_T = TypeVar("_T")


MAX_TOKENS = 2**53 - 1
"""The largest token count (and running token sum) a usage record may carry, either sign.

Every backend sums exactly up to here, including Redis, whose scripts compute in doubles."""


def _refuse_constant(name: str) -> NoReturn:
    raise ValueError(name)


def _holds_non_finite(encoded: str) -> bool:
    """Whether JSON written with ``ser_json_inf_nan="constants"`` holds a NaN or an infinity.

    Only called when the text contains one of those words, which a string value may as well.
    """
    try:
        json.loads(encoded, parse_constant=_refuse_constant)
    except ValueError:
        return True
    return False


def encode(value: BaseModel, what: str = "payload") -> str:
    """Encode a durable model as canonical JSON, or raise ``SessionError("invalid_payload")``.

    One serializer pass: every durable model writes NaN and infinities as the bare words
    ``NaN`` and ``Infinity`` (`Frozen`'s ``ser_json_inf_nan``; never valid JSON), so only a
    text containing one of them needs a second look.
    """
    try:
        encoded = value.model_dump_json()
    except Exception as exc:  # pydantic wraps encoder failures (lone surrogates, ...) variously
        raise SessionError("invalid_payload", f"{what} is not JSON-serializable: {exc}") from exc
    if ("NaN" in encoded or "Infinity" in encoded) and _holds_non_finite(encoded):
        raise SessionError("invalid_payload", f"{what} holds a non-finite number")
    return encoded


def check_usage_amount(usage: TokenUsage, what: str) -> None:
    """Refuse token counts beyond ±`MAX_TOKENS` (costs are finite once encoded)."""
    for name in ("input", "output", "cache_read", "cache_write", "total_tokens"):
        count = getattr(usage, name)
        if not -MAX_TOKENS <= count <= MAX_TOKENS:
            raise SessionError(
                "invalid_payload", f"{what}: {name}={count} is beyond ±{MAX_TOKENS} tokens"
            )


def encode_entry(entry: Entry) -> str:
    """Encode an entry; anything that is not one of the seven entry types is refused."""
    if not isinstance(entry, ENTRY_TYPES):
        raise SessionError("invalid_payload", f"not an entry: {type(entry).__name__}")
    return encode(entry, f"entry {entry.id!r}")


def encode_record(record: Record) -> str:
    """Encode a record; anything that is not one of the record types is refused."""
    if not isinstance(record, RECORD_TYPES):
        raise SessionError("invalid_payload", f"not a record: {type(record).__name__}")
    encoded = encode(record, f"record {record.id!r}")
    if isinstance(record, Usage):
        check_usage_amount(record.usage, f"record {record.id!r}")
    return encoded


def encode_fact(fact: Fact) -> str:
    """Encode a fact."""
    if not isinstance(fact, (NameFact, LabelFact)):
        raise SessionError("invalid_payload", f"not a fact: {type(fact).__name__}")
    return encode(fact, "fact")


def encode_log_item(item: LogItem) -> str:
    """Encode a log item (the JSONL line format)."""
    return encode(item, f"log item {item.seq}")


def decode(adapter: TypeAdapter[_T], text: str | bytes, location: str) -> _T:
    """Decode stored JSON with `adapter`, raising `StoreCorrupted` naming `location` on failure."""
    try:
        return adapter.validate_json(text)
    except ValidationError as exc:
        raise StoreCorrupted(
            f"stored data at {location} does not decode: {exc.errors(include_url=False)[:1]}",
            location=location,
        ) from exc


def decode_entry(text: str | bytes, location: str) -> Entry:
    """Decode a stored entry payload."""
    return decode(entry_adapter, text, location)


def decode_record(text: str | bytes, location: str) -> Record:
    """Decode a stored record payload."""
    return decode(record_adapter, text, location)


def decode_log_item(text: str | bytes, location: str) -> LogItem:
    """Decode a stored log item."""
    return decode(log_item_adapter, text, location)


def decode_metadata(data: dict[str, Any], location: str) -> SessionMetadata:
    """Build metadata from stored fields."""
    try:
        return SessionMetadata.model_validate(data)
    except ValidationError as exc:
        raise StoreCorrupted(
            f"session metadata at {location} is invalid: {exc}", location=location
        ) from exc


def fact_set(seq: int, timestamp: int, fact: Fact) -> FactSet:
    """Build the log item of a fact write."""
    return FactSet(seq=seq, timestamp=timestamp, fact=fact)
