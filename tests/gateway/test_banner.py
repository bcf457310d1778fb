"""What `gateway serve` prints first: the way to a thread a person can write in at once."""

from __future__ import annotations

import shlex

from config import Settings
from gateway.serve import banner


def _lines(settings: Settings) -> list[str]:
    return [line.strip() for line in banner(settings, "scripted:echo").splitlines()]


def test_with_no_route_the_default_space_is_shown() -> None:
    lines = _lines(Settings())
    assert "open http://127.0.0.1:8787/web/threads/hello/page and write, or:" in lines
    assert "curl -s http://127.0.0.1:8787/web/threads/hello" in lines


def test_the_first_web_space_a_route_names_is_shown_with_its_space() -> None:
    """The MCP walkthrough routes the web space `desk` to its profile; the banner pointed to
    the default space, where the desk's profile does not apply."""
    settings = Settings.model_validate(
        {
            "routes": [
                {"channel": "slack", "space": "C0123ABCD", "session": "ops"},
                {"channel": "web", "space": "desk", "session": "desk"},
                {"channel": "web", "space": "*", "session": "all"},
            ]
        }
    )
    lines = _lines(settings)
    assert "open http://127.0.0.1:8787/web/threads/hello/page?space=desk and write, or:" in (lines)
    [post] = [line for line in lines if "-X POST" in line]
    words = shlex.split(post)  # what a shell gives curl
    assert words[words.index("-d") + 1] == '{"space": "desk", "text": "hello"}'
    assert "curl -s 'http://127.0.0.1:8787/web/threads/hello?space=desk'" in lines
