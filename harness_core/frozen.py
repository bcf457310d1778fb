"""Immutability: the base of every durable model, and frozen JSON values.

`Frozen` is the base of every durable pydantic type (frozen, closed, finite floats only);
`revalidated` checks again a value that skipped validation.

Every free-form payload the session stores (custom entry data, tool arguments, details,
metadata) passes through `freeze_json` when its model is built, so a value that JSONL, SQLite
or Redis could not store never reaches any backend, and nothing a reader gets back can be
mutated in place. Object keys are sorted while freezing, which makes the JSON encoding of a
payload canonical (append-if-missing compares encodings byte for byte).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeAlias, TypeVar

from pydantic import BaseModel, ConfigDict, PlainValidator, ValidationError

__all__ = [
    "Frozen",
    "FrozenDict",
    "FrozenJson",
    "FrozenJsonObject",
    "JsonValue",
    "freeze_json",
    "invalid_reason",
    "revalidated",
    "thaw_json",
]

JsonValue: TypeAlias = (
    bool | int | float | str | Sequence["JsonValue"] | Mapping[str, "JsonValue"] | None
)

MAX_DEPTH = 64


class FrozenDict(dict[str, Any]):
    """A dict that refuses mutation; JSON libraries and pydantic still see a plain dict."""

    __slots__ = ()

    def _refuse(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError("stored session data is immutable")

    __setitem__ = _refuse
    __delitem__ = _refuse
    clear = _refuse
    pop = _refuse
    popitem = _refuse
    setdefault = _refuse
    update = _refuse

    def __ior__(self, other: object) -> NoReturn:  # type: ignore[misc]
        raise TypeError("stored session data is immutable")

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(self.items()))

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenDict, (dict(self),))

    def __copy__(self) -> FrozenDict:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenDict:
        return self


def freeze_json(value: object, _depth: int = 0) -> Any:
    """Return `value` as frozen JSON, or raise ValueError naming why it is not JSON.

    Accepts None, bool, int, finite float, str, lists/tuples and dicts with str keys. Lists become
    tuples, dicts become `FrozenDict` with sorted keys. Rejects NaN and infinities, non-str keys,
    other types, and nesting deeper than 64 levels (which also catches cycles).
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} is not a JSON number")
        return value
    if _depth >= MAX_DEPTH:
        raise ValueError(f"JSON nesting deeper than {MAX_DEPTH} levels (or a cycle)")
    if isinstance(value, FrozenDict):
        return value
    if isinstance(value, (list, tuple)):
        return tuple(freeze_json(item, _depth + 1) for item in value)
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise ValueError(f"JSON object keys must be strings, got {type(key).__name__}")
        return FrozenDict((key, freeze_json(value[key], _depth + 1)) for key in sorted(value))
    raise ValueError(f"{type(value).__name__} is not a JSON value")


def _freeze_object(value: object) -> FrozenDict:
    frozen = freeze_json(value)
    if not isinstance(frozen, FrozenDict):
        raise ValueError(f"expected a JSON object, got {type(value).__name__}")
    return frozen


def thaw_json(value: Any) -> Any:
    """Return a mutable deep copy of a frozen JSON value (tuples to lists, dicts to dicts)."""
    if isinstance(value, dict):
        return {key: thaw_json(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return [thaw_json(item) for item in value]
    return value


if TYPE_CHECKING:
    FrozenJson: TypeAlias = JsonValue
    FrozenJsonObject: TypeAlias = Mapping[str, JsonValue]
else:
    # At runtime pydantic must not build a schema for the recursive alias: the validator does
    # all the checking, and serialization infers plain dicts and lists from the frozen values.
    FrozenJson = Annotated[Any, PlainValidator(freeze_json)]
    FrozenJsonObject = Annotated[Any, PlainValidator(_freeze_object)]


_M = TypeVar("_M", bound=BaseModel)


class Frozen(BaseModel):
    """Immutable, closed to unknown fields, finite floats only: the base of every durable type.

    A non-finite float can still get in past validation (`revalidated` says how); its JSON is
    then the bare word ``NaN`` or ``Infinity``, which no JSON reader accepts, rather than a
    silent ``null``, and the codec refuses to store it.
    """

    model_config = ConfigDict(
        frozen=True, extra="forbid", allow_inf_nan=False, ser_json_inf_nan="constants"
    )


def revalidated(value: _M) -> _M:
    """`value` checked again from its fields.

    A model built with `model_copy(update=...)` or `model_construct`, or nested into another
    model as an instance, skipped validation: a provider's cost can be NaN that way. Values
    that come from outside the harness (providers, tools, hooks, callers) pass here before
    they can reach a record or an entry.

    Raises:
        ValidationError: the value is not valid.
    """
    return type(value).model_validate(value.model_dump())


def invalid_reason(error: ValidationError) -> str:
    """One line naming the first invalid field (never the value: it may be content)."""
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "value"
    return f"{where}: {first['msg']}"
