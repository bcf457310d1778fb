"""Structured logs: one JSON object per line, identifiers and outcomes only (never content, keys).

Callers log `event("message accepted", session=..., lane=...)`; the formatter adds the time,
level and logger. Message text, tool data and credentials never go into a log line: the fields
are ids, kinds, counts and short secret-free reasons.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["JsonFormatter", "configure", "event", "redact_with"]

_redactors: list[Callable[[str], str]] = []
"""What every line passes through before it is written (`redact_with`)."""


def redact_with(redact: Callable[[str], str]) -> Callable[[], None]:
    """Pass every line a `JsonFormatter` writes through `redact`; returns what stops it.

    The service registers its `gateway.redact.Redactor` at start (configured secrets never
    reach a log line, whoever logged it) and removes it at stop.
    """
    _redactors.append(redact)

    def remove() -> None:
        with contextlib.suppress(ValueError):
            _redactors.remove(redact)

    return remove


class _Event(str):
    """A log message carrying structured fields (still a readable string)."""

    fields: dict[str, Any]

    def __new__(cls, name: str, fields: dict[str, Any]) -> _Event:
        made = super().__new__(cls, name)
        made.fields = fields
        return made


def event(name: str, **fields: Any) -> str:
    """A log message `name` with fields (ids, kinds, counts; nothing a user wrote)."""
    return _Event(name, {k: v for k, v in fields.items() if v is not None})


_RECORD_ATTRIBUTES = frozenset(
    {*logging.LogRecord("", 0, "", 0, "", None, None).__dict__, "message", "asctime", "taskName"}
)


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as ``{"ts", "level", "logger", "event", ...fields}``."""
        payload: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": _message(record),
        }
        fields = getattr(record.msg, "fields", None)
        if fields:
            payload.update(fields)
        for key, value in record.__dict__.items():  # `extra=` fields (what adapters log)
            if key not in _RECORD_ATTRIBUTES and key not in payload:
                payload[key] = value
        if record.exc_info and record.exc_info[0] is not None:
            payload["error"] = record.exc_info[0].__name__  # the type only: messages may carry data
        line = json.dumps(payload, default=str, separators=(",", ":"))
        for redact in tuple(_redactors):
            line = redact(line)
        return line


def _message(record: logging.LogRecord) -> str:
    """The record's message: a library's ``%`` arguments filled in when they are numbers.

    Any other argument may quote a request, a command or a person's text: it is named by its
    type (``<str>``), as an exception is by its type alone. Unfilled, "Cancel %s running
    task(s)" said nothing of how many.
    """
    if not isinstance(record.msg, str) or not isinstance(record.args, tuple) or not record.args:
        return str(record.msg)
    shown = tuple(
        value if isinstance(value, int | float) else f"<{type(value).__name__}>"
        for value in record.args
    )
    try:
        return record.msg % shown
    except (TypeError, ValueError):  # a %d given what is now "<str>", or a malformed format
        return record.msg


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a line is logged (not when configured).

    A handler holding the stream it was given keeps writing to it after it is replaced and
    closed (a test's captured stderr): every later line is then a logging error.
    """

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


LIBRARY_LEVEL = logging.WARNING
"""The least severe line written from a logger outside ``gateway`` and ``adapters`` (uvicorn,
asyncio, redis-py, slack-bolt...): their info and debug lines may quote requests and bodies."""


def configure(level: str) -> None:
    """Send every log line of the process to stderr as JSON (libraries' from warning up).

    ``gateway`` and ``adapters`` log at `level`; every other logger (uvicorn's, asyncio's, the
    libraries') at warning or above, whatever `level` is. One handler on the root logger, so no
    library's line reaches stderr in its own format (a logger without handlers would otherwise
    fall back to Python's last-resort handler: plain text, tracebacks in full). Warnings go
    through it too, and so does an exception a thread did not catch: one line with its type.
    """
    handler = _Stderr()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(LIBRARY_LEVEL, logging.getLevelNamesMapping()[level.upper()]))
    # A library that set up its own handlers or levels (uvicorn's default dictConfig, run once in
    # this process) would otherwise keep printing its own format, or below warning.
    for existing in list(logging.root.manager.loggerDict.values()):
        if isinstance(existing, logging.Logger):
            existing.handlers.clear()
            existing.setLevel(logging.NOTSET)
            existing.propagate = True
    for name in ("gateway", "adapters"):
        logging.getLogger(name).setLevel(level.upper())
    logging.captureWarnings(True)
    threading.excepthook = _thread_failed


def _thread_failed(failed: threading.ExceptHookArgs) -> None:
    """An exception no thread caught: one JSON line (its type), not a traceback on stderr."""
    if failed.exc_type is SystemExit:
        return
    thread = failed.thread.name if failed.thread is not None else None
    logging.getLogger("gateway.threads").error(
        event("thread failed", thread=thread, error=failed.exc_type.__name__)
    )
