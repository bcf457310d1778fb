"""Structured logs: one JSON line per event, `extra=` fields included, stderr followed."""

from __future__ import annotations

import io
import json
import logging
import sys

import pytest

from gateway.logs import configure, event


@pytest.fixture
def restore_loggers():
    saved = {
        name: (logging.getLogger(name).handlers[:], logging.getLogger(name).propagate)
        for name in ("gateway", "adapters")
    }
    yield
    for name, (handlers, propagate) in saved.items():
        logging.getLogger(name).handlers[:] = handlers
        logging.getLogger(name).propagate = propagate


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
