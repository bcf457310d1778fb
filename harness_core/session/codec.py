"""The one JSON codec every backend stores through: canonical encodings and checked decodes.

Encodings are canonical (field order is fixed by the models and JSON object keys are sorted
when values are frozen), so two payloads are equal iff their encodings are equal; backends
that cannot compare models (a Redis script) compare encodings. Encoding is also the last gate
before a write: anything that cannot be encoded, or would not decode back to what was given,
raises ``SessionError("invalid_payload")`` before a backend touches durable state. That covers
values that skipped validation (``model_copy(update=...)`` does): a NaN or an infinity, which
pydantic's JSON encoder would silently write as ``null``, and usage amounts that the backends'
running sums cannot hold exactly. Decoding failures raise `StoreCorrupted`.

Checksums (D240, D241): a persistent backend stores a CRC32C (`checksum`) of every payload it
writes, next to it. A payload read back with a matching checksum is byte for byte what `encode`
wrote from a validated model, so it is decoded by the *trusted* decoders (`trusted_entry`,
`trusted_record`, `trusted_fact`, `trusted_log_item`): the same pydantic-core validators with
the checks that only repeat what the write already proved (model validators in `_CHECKS`, id and
name patterns and lengths) left out, and the stored wrappers (`stored_entry`, `stored_record`,
`fact_set`) built from the backend's own columns without validation. A mismatch raises
`StoreCorrupted` naming the location (`corrupted`); a payload without a checksum (written before
checksums, or imported from elsewhere) is decoded with full validation, as before.
"""

from __future__ import annotations

import json
from typing import Any, NoReturn, TypeVar

import google_crc32c
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic_core import CoreSchema, SchemaValidator

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
from harness_core.session.types import (
    Fact,
    FactSet,
    LabelFact,
    LaneMove,
    LogItem,
    NameFact,
    SessionMetadata,
    StoredEntry,
    StoredRecord,
)

__all__ = [
    "ENTRY_TYPES",
    "MAX_TOKENS",
    "RECORD_TYPES",
    "check_usage_amount",
    "checksum",
    "corrupted",
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
    "fact_set",
    "lane_move",
    "log_item_adapter",
    "record_adapter",
    "stored_entry",
    "stored_record",
    "trusted_entry",
    "trusted_fact",
    "trusted_log_item",
    "trusted_record",
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


# -- checksums and trusted reads --------------------------------------------------------------


def checksum(payload: str | bytes, *fields: str | int | None) -> int:
    """The CRC32C of a stored payload's UTF-8 bytes, then of `fields` (the row's own columns).

    Fields are joined as ``TAB field`` each (None as the empty text: every stored id and lane
    name is at least one character long, so the two never meet).
    """
    data = payload.encode() if isinstance(payload, str) else payload
    if fields:
        data += (
            "\t" + "\t".join(["" if field is None else str(field) for field in fields])
        ).encode()
    crc: int = google_crc32c.value(data)
    return crc


def corrupted(location: str, stored: int, computed: int) -> StoreCorrupted:
    """The error of a payload whose checksum does not match: its bytes changed after the write."""
    return StoreCorrupted(
        f"stored data at {location} fails its checksum (stored {stored:08x}, "
        f"computed {computed:08x}): it changed after it was written",
        location=location,
    )


_CHECKS = frozenset(
    {
        "MessageEntry._terminate_only_on_tool_results",
        "AssistantMessage._deferred_matches_stop_reason",
        "Usage._fields_match_cause",
        "ApprovalDecision._override_only_when_approved",
        "ToolFile._plain_name",
        "ToolFile._base64",
    }
)
"""The model and field validators that only check (return their input unchanged), by qualified
name: a trusted decoder leaves them out. A validator not named here stays in the trusted
decoder too (correct, only slower); one that transforms must never be named here."""
_STRING_CHECKS = frozenset({"pattern", "min_length", "max_length"})


def _unchecked(schema: Any) -> Any:
    """A copy of a core schema without the checks a verified payload already passed."""
    if isinstance(schema, list):
        return [_unchecked(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    if schema.get("type") == "function-after":
        function = schema["function"]["function"]
        if getattr(function, "__qualname__", None) in _CHECKS:
            return _unchecked(schema["schema"])
    drop = _STRING_CHECKS if schema.get("type") == "str" else frozenset()
    return {key: _unchecked(value) for key, value in schema.items() if key not in drop}


def _trusted(adapter: TypeAdapter[Any]) -> SchemaValidator:
    schema: CoreSchema = _unchecked(adapter.core_schema)
    return SchemaValidator(schema)


_trusted_entry = _trusted(entry_adapter)
_trusted_record = _trusted(record_adapter)
_trusted_fact = _trusted(fact_adapter)
_trusted_log_item = _trusted(log_item_adapter)


def _trusted_decode(validator: SchemaValidator, text: str | bytes, location: str) -> Any:
    try:
        return validator.validate_json(text)
    except ValidationError as exc:  # a payload this version's writer could not have written
        raise StoreCorrupted(
            f"stored data at {location} does not decode: {exc.errors(include_url=False)[:1]}",
            location=location,
        ) from exc


def trusted_entry(text: str | bytes, location: str) -> Entry:
    """Decode an entry payload whose checksum matched (see the module docstring)."""
    entry: Entry = _trusted_decode(_trusted_entry, text, location)
    return entry


def trusted_record(text: str | bytes, location: str) -> Record:
    """Decode a record payload whose checksum matched."""
    record: Record = _trusted_decode(_trusted_record, text, location)
    return record


def trusted_fact(text: str | bytes, location: str) -> Fact:
    """Decode a fact payload whose checksum matched."""
    fact: Fact = _trusted_decode(_trusted_fact, text, location)
    return fact


def trusted_log_item(text: str | bytes, location: str) -> LogItem:
    """Decode a log item (a JSONL line's item) whose checksum matched."""
    item: LogItem = _trusted_decode(_trusted_log_item, text, location)
    return item


_new = object.__new__
_put = object.__setattr__
_M = TypeVar("_M", bound=BaseModel)


def _built(cls: type[_M], values: dict[str, Any], given: frozenset[str]) -> _M:
    """An instance of `cls` holding `values`, made as ``model_construct`` makes one.

    For the wrappers a backend builds from its own columns and a decoded payload: validating
    them again costs more than decoding the payload (measured in D241).
    """
    instance = _new(cls)
    _put(instance, "__dict__", values)
    _put(instance, "__pydantic_fields_set__", set(given))
    _put(instance, "__pydantic_extra__", None)
    _put(instance, "__pydantic_private__", None)
    return instance


_ENTRY_GIVEN = frozenset({"seq", "timestamp", "lane", "parent_id", "entry"})
_RECORD_GIVEN = frozenset({"seq", "timestamp", "record"})
_FACT_GIVEN = frozenset({"seq", "timestamp", "fact"})
_LANE_GIVEN = frozenset({"seq", "timestamp", "lane", "leaf_id", "created"})


def stored_entry(
    seq: int, timestamp: int, lane: str | None, parent_id: str | None, entry: Entry
) -> StoredEntry:
    """The stored entry of a backend's columns and its decoded (trusted) entry, unvalidated."""
    values = {
        "kind": "entry",
        "seq": seq,
        "timestamp": timestamp,
        "lane": lane,
        "parent_id": parent_id,
        "entry": entry,
    }
    return _built(StoredEntry, values, _ENTRY_GIVEN)


def stored_record(seq: int, timestamp: int, record: Record) -> StoredRecord:
    """The stored record of a backend's columns and its decoded (trusted) record, unvalidated."""
    values = {"kind": "record", "seq": seq, "timestamp": timestamp, "record": record}
    return _built(StoredRecord, values, _RECORD_GIVEN)


def fact_set(seq: int, timestamp: int, fact: Fact) -> FactSet:
    """The log item of a fact write, from a backend's columns and a decoded fact, unvalidated."""
    values = {"kind": "fact", "seq": seq, "timestamp": timestamp, "fact": fact}
    return _built(FactSet, values, _FACT_GIVEN)


def lane_move(seq: int, timestamp: int, lane: str, leaf_id: str | None, created: bool) -> LaneMove:
    """The log item of a lane move, from a backend's own columns, unvalidated."""
    values = {
        "kind": "lane",
        "seq": seq,
        "timestamp": timestamp,
        "lane": lane,
        "leaf_id": leaf_id,
        "created": created,
    }
    return _built(LaneMove, values, _LANE_GIVEN)
