"""The query and header parameters the operator routes share: paging, idempotency, waiting."""

from __future__ import annotations

from typing import Annotated

from fastapi import Header, Query

__all__ = ["Cursor", "IdempotencyKey", "KeyQuery", "Limit", "Wait"]

_KEY = r"^[!-~]{1,512}$"

Limit = Annotated[int, Query(ge=1, le=100, description="Items per page (1-100).")]
Cursor = Annotated[str | None, Query(max_length=2048, description="`next_cursor` of a page.")]
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        pattern=_KEY,
        description="1-512 visible ASCII characters; the same key replays the first result.",
    ),
]
Wait = Annotated[
    float,
    Query(
        ge=0,
        le=30,
        allow_inf_nan=False,
        description="Seconds to wait for the result (then 202).",
    ),
]

KeyQuery = Annotated[
    str,
    Query(
        alias="key",
        pattern=_KEY,
        description="An Idempotency-Key this caller sent with an action.",
    ),
]
