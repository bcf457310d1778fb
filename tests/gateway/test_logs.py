"""Structured logs: one JSON line per event, `extra=` fields included, stderr followed."""

from __future__ import annotations

import io
import json
import logging
import sys
import threading
import warnings

import pytest

from gateway.logs import configure, event


@pytest.fixture
def restore_loggers():
    names = ("gateway", "adapters", "")
    saved = {
        name: (
            logging.getLogger(name).handlers[:],
            logging.getLogger(name).propagate,
            logging.getLogger(name).level,
        )
        for name in names
    }
    hook = threading.excepthook
    yield
    for name, (handlers, propagate, level) in saved.items():
        logging.getLogger(name).handlers[:] = handlers
        logging.getLogger(name).propagate = propagate
        logging.getLogger(name).setLevel(level)
    threading.excepthook = hook
    logging.captureWarnings(False)


def test_lines_are_json_with_event_and_extra_fields(restore_loggers, monkeypatch) -> None:
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    configure("info")
    logging.getLogger("gateway.worker").info(event("session taken", session="s1"))
    logging.getLogger("adapters.slack").warning("slack ignored", extra={"reason": "edit"})
    lines = [json.loads(line) for line in first.getvalue().splitlines()]
    assert [(x["event"], x["logger"]) for x in lines] == [
        ("session taken", "gateway.worker"),
        ("slack ignored", "adapters.slack"),
    ]
    assert lines[0]["session"] == "s1" and lines[1]["reason"] == "edit"


def test_a_replaced_and_closed_stderr_is_not_written_to(restore_loggers, monkeypatch) -> None:
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    configure("info")
    first.close()  # a test's captured stderr, gone
    monkeypatch.setattr(sys, "stderr", second)
    logging.getLogger("gateway.x").info(event("after", n=1))
    assert json.loads(second.getvalue())["event"] == "after"


def test_every_logger_of_the_process_writes_json_lines(restore_loggers, monkeypatch) -> None:
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    configure("info")
    try:
        raise ConnectionResetError("the peer said: secret")
    except ConnectionResetError:
        logging.getLogger("uvicorn.error").exception("Exception in ASGI application")
    logging.getLogger("asyncio").error("Task exception was never retrieved\nfuture: <Task>")
    logging.getLogger("uvicorn.error").info("Started server process [%d]", 1)  # under warning
    logging.getLogger("redis").debug("a command, with its arguments")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("old API", DeprecationWarning, stacklevel=1)
    thread = threading.Thread(target=lambda: 1 / 0, name="io")
    thread.start()
    thread.join()
    lines = [json.loads(line) for line in stderr.getvalue().splitlines()]
    assert [(x["logger"], x["level"], x.get("error")) for x in lines] == [
        ("uvicorn.error", "error", "ConnectionResetError"),
        ("asyncio", "error", None),
        ("py.warnings", "warning", None),
        ("gateway.threads", "error", "ZeroDivisionError"),
    ]
    assert "Traceback" not in stderr.getvalue() and "secret" not in stderr.getvalue()


def test_a_library_line_s_numbers_are_filled_in_and_its_other_arguments_named(
    restore_loggers, monkeypatch
) -> None:
    """ "Cancel %s running task(s)" (uvicorn, at the drain's end) was written with its %s."""
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    configure("info")
    uvicorn = logging.getLogger("uvicorn.error")
    uvicorn.error("Cancel %s running task(s), timeout graceful shutdown exceeded", 3)
    uvicorn.warning("Invalid request from %s: %r (%.1f s)", "10.0.0.1", b"secret body", 2.5)
    uvicorn.warning("%d of %d", "not", "numbers")
    uvicorn.warning("100%% sure")
    events = [json.loads(line)["event"] for line in stderr.getvalue().splitlines()]
    assert events == [
        "Cancel 3 running task(s), timeout graceful shutdown exceeded",
        "Invalid request from <str>: '<bytes>' (2.5 s)",
        "%d of %d",
        "100%% sure",
    ]


@pytest.mark.parametrize("level", ["debug", "info", "warning", "error"])
def test_the_level_is_ours_libraries_log_from_warning_up(
    restore_loggers, monkeypatch, level: str
) -> None:
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    configure(level)
    for name in ("gateway.worker", "adapters.web", "slack_bolt", "uvicorn.error"):
        for severity in ("debug", "info", "warning", "error"):
            getattr(logging.getLogger(name), severity)(event(severity))
    written = {(x["logger"], x["event"]) for x in map(json.loads, stderr.getvalue().splitlines())}
    order = ["debug", "info", "warning", "error"]
    ours = order[order.index(level) :]
    theirs = order[max(order.index(level), order.index("warning")) :]
    assert written == {
        *((name, s) for name in ("gateway.worker", "adapters.web") for s in ours),
        *((name, s) for name in ("slack_bolt", "uvicorn.error") for s in theirs),
    }
