"""`gateway serve`'s event loop (D276): uvloop where it is installed, asyncio's when asked."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateway import event_loop
from gateway.errors import GatewayError
from tests.gateway.test_serve_process import _answers, _post, _settings
from tests.support.gateway_process import ROOT, GatewayProcess


def test_auto_is_uvloop_where_it_is_installed_and_asyncio_is_asyncio() -> None:
    # uvloop is a dependency on this platform: `auto` must find it
    assert event_loop.loop_name("auto") == "uvloop"
    assert event_loop.loop_name("uvloop") == "uvloop"
    assert event_loop.loop_name("asyncio") == "asyncio"
    assert event_loop.loop_factory("asyncio") is None
    factory = event_loop.loop_factory("auto")
    assert factory is not None
    loop = factory()
    try:
        assert type(loop).__module__ == "uvloop"
    finally:
        loop.close()


def test_without_uvloop_auto_is_asyncio_and_uvloop_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(event_loop, "_uvloop_installed", lambda: False)
    assert event_loop.loop_name("auto") == "asyncio"
    assert event_loop.loop_factory("auto") is None
    with pytest.raises(GatewayError, match="GATEWAY_EVENT_LOOP=uvloop, but uvloop is not"):
        event_loop.loop_name("uvloop")


def test_an_unknown_loop_is_a_one_line_settings_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--port", "0"],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "GATEWAY_EVENT_LOOP": "trio"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "GATEWAY_EVENT_LOOP" in line and "trio" in line, line


async def test_serve_on_asyncios_own_loop_answers_and_drains(tmp_path: Path) -> None:
    settings = _settings(tmp_path, event_loop="asyncio")
    gateway = GatewayProcess("gw", tmp_path, settings).start()
    try:
        _post(gateway, "plain", "hello")
        deadline = time.monotonic() + 20
        while not (answers := await _answers(settings["web_url"], "plain")):
            assert time.monotonic() < deadline, gateway.tail()
            await asyncio.sleep(0.1)
        assert gateway.terminate() == 0
    finally:
        gateway.stop()
    assert [a.text for a in answers] == ["You said: hello"]
    log = gateway.log_path.read_text()
    [loop] = [json.loads(line) for line in log.splitlines() if '"event loop"' in line]
    assert loop["loop"].startswith("asyncio.") and "uvloop" not in loop["loop"], loop
