"""The `gateway` command: the demo, store inspection, and honest refusals."""

from __future__ import annotations

import pytest

from config import Settings
from gateway.cli import main


def test_the_demo_crashes_one_lane_and_restores_it(tmp_path, capsys) -> None:
    store = f"sqlite:///{tmp_path}/gw.db"
    assert main(["demo", "--store", store], settings=Settings()) == 0
    out = capsys.readouterr().out
    assert "email:<demo-thread@example.com>: SUSPENDED (crash) in run m1-run" in out
    assert "slack:C0DEMO:1764489600.000100: idle at s1-reply" in out
    assert "stats   3 entries, 6 records, 59 tokens" in out
    session_id = out.split("session ")[1].split()[0]

    assert main(["store", "--store", store], settings=Settings()) == 0
    assert session_id in capsys.readouterr().out
    assert main(["store", session_id, "--store", store], settings=Settings()) == 0
    shown = capsys.readouterr().out
    assert "lane email:<demo-thread@example.com>" in shown and "(open operation)" in shown
    assert "operation_finished" in shown


def test_the_default_store_comes_from_settings(tmp_path, capsys) -> None:
    assert main(["demo"], settings=Settings(store_url=f"jsonl:///{tmp_path}/sessions")) == 0
    assert list((tmp_path / "sessions").glob("*.jsonl"))
    capsys.readouterr()


def test_serve_says_it_is_not_there_yet(capsys) -> None:
    assert main(["serve"], settings=Settings(store_url="memory://")) == 2
    assert "not implemented yet" in capsys.readouterr().err


def test_a_bad_store_url_is_a_clear_error(capsys) -> None:
    assert main(["store", "--store", "postgres://x/y"], settings=Settings()) == 1
    assert "unsupported store URL 'postgres://x/y'" in capsys.readouterr().err


def test_an_unknown_session_is_a_clear_error(tmp_path, capsys) -> None:
    assert (
        main(["store", "nope", "--store", f"sqlite:///{tmp_path}/gw.db"], settings=Settings()) == 1
    )
    assert "session 'nope' does not exist" in capsys.readouterr().err


def test_a_command_is_required() -> None:
    with pytest.raises(SystemExit):
        main([], settings=Settings())
