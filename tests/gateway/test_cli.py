"""The `gateway` command: the demo, store inspection, and honest refusals."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adapters import AdapterError
from config import Settings
from gateway import GatewayError, cli
from gateway.channels import gateway_settings
from gateway.cli import main
from harness_core import SessionError


def _demo_store(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path}/gw.db"
    if backend == "jsonl":
        return f"jsonl:///{tmp_path}/sessions"
    server = request.getfixturevalue("redis_server")
    return f"{server.url}?prefix={request.getfixturevalue('redis_prefix')}"


@pytest.mark.parametrize("backend", ["sqlite", "jsonl", "redis"])
def test_the_demo_kills_a_real_process_mid_tool_and_a_second_one_recovers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest, backend: str
) -> None:
    store = _demo_store(backend, tmp_path, request)
    began = time.monotonic()
    assert main(["demo", "--store", store], settings=Settings()) == 0
    assert time.monotonic() - began < 30  # seconds, even on a loaded machine
    out = capsys.readouterr().out
    killed = re.search(
        r"^process 1 \(pid (\d+)\) answered the Slack thread, then was killed "
        r"\(SIGKILL, exit status -9\) while sending an email:$",
        out,
        re.M,
    )
    took = re.search(r"^process 2 \(pid (\d+)\) took the session after [\d.]+ s", out, re.M)
    assert killed and took, out
    pids = {int(killed.group(1)), int(took.group(1)), os.getpid()}
    assert len(pids) == 3  # two processes of their own, neither this one
    crash_log = out.split("process 2")[0]
    assert crash_log.rstrip().endswith("tool_started       send_email")  # died mid-tool
    assert "email:<demo-thread@example.com>: SUSPENDED (crash) run" in out
    assert "slack:C0DEMO:1764489600.000100: idle (nothing open: not restored)" in out
    assert "resume email:<demo-thread@example.com>: completed" in out
    assert "It may or may not have happened" in out  # the never-replayed send was not repeated
    assert "cannot confirm it went out" in out
    session_id = out.split("session ")[1].split()[0]

    assert main(["store", "--store", store], settings=Settings()) == 0
    assert session_id in capsys.readouterr().out
    assert main(["store", session_id, "--store", store], settings=Settings()) == 0
    shown = capsys.readouterr().out
    assert "lane email:<demo-thread@example.com>" in shown and "(idle)" in shown
    assert "(open operation)" not in shown
    assert shown.count("operation_finished") == 2
    assert shown.count("tool_started       send_email") == 1  # started once, never again


@pytest.mark.parametrize("store", ["memory://"])
def test_a_demo_on_a_store_of_one_process_is_one_line(
    store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--store", store], settings=Settings()) == 2  # a --store URL, as for all
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "need a store both can open" in err


def test_the_default_store_comes_from_settings(tmp_path, capsys) -> None:
    assert main(["ask", "hi"], settings=Settings(store_url=f"jsonl:///{tmp_path}/sessions")) == 0
    assert list((tmp_path / "sessions").glob("*.jsonl"))
    said = capsys.readouterr()
    # the answer alone on stdout (`ask ... | tool` reads it), the tokens it took on stderr
    assert said.out == "You said: hi\n"
    assert re.fullmatch(r"\(scripted:echo: \d+ tokens in, \d+ out\)\n", said.err), said.err


def test_the_demo_keeps_its_sessions_out_of_the_configured_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A newcomer's first `scripts/run demo` left a "gateway demo" session in the store that
    `serve` then used (and `ops lanes` listed)."""
    monkeypatch.chdir(tmp_path)
    assert main(["demo"], settings=Settings(store_url=f"jsonl:///{tmp_path}/sessions")) == 0
    assert not (tmp_path / "sessions").exists()
    assert (tmp_path / ".gateway" / "demo.db").exists()
    assert "--store sqlite:///.gateway/demo.db" in capsys.readouterr().out


@pytest.mark.parametrize("where", ["before", "after"])
def test_ask_and_store_read_the_toml_file_serve_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    """Only `serve` took --config: `ask` made a second store (and used another agent), and
    `store list` said there was none."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "gw.toml").write_text('store_url = "sqlite:///data/gw.db"\n')

    def run(*words: str) -> int:
        config = ["--config", "gw.toml"]
        return main([*config, *words] if where == "before" else [*words, *config])

    assert run("ask", "--lane", "cli:toml", "hello") == 0
    assert (tmp_path / "data" / "gw.db").exists() and not (tmp_path / ".gateway").exists()
    capsys.readouterr()
    assert run("store", "list") == 0
    assert "cli" in capsys.readouterr().out


@contextlib.contextmanager
def _a_taken_port() -> Iterator[int]:
    """A loopback port something else listens on while the block runs."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


def _sqlite(tmp_path: Path, **more: Any) -> Settings:
    return gateway_settings(
        store_url=f"sqlite:///{tmp_path}/s.db",
        broker_url=f"sqlite:///{tmp_path}/b.db",
        web_url=f"sqlite:///{tmp_path}/w.db",
        **more,
    )


def test_serve_on_a_taken_port_is_one_clear_line(tmp_path, capsys) -> None:
    with _a_taken_port() as port:
        settings = _sqlite(tmp_path)
        assert main(["serve", "--port", str(port)], settings=settings) == 2
        err = capsys.readouterr().err.strip().splitlines()
        # options alone are the service's, as `scripts/run` takes them ("invalid choice" before)
        assert main(["--port", str(port)], settings=settings) == 2
        alone = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"gateway: cannot listen on 127.0.0.1:{port}")
    assert alone[-1] == err[-1]
    assert "Traceback" not in "\n".join(err)


def test_a_bad_store_url_is_a_clear_error(capsys) -> None:
    assert main(["store", "--store", "postgres://x/y"], settings=Settings()) == 2
    assert "unsupported store URL 'postgres://x/y'" in capsys.readouterr().err


def test_a_store_url_with_a_host_is_refused_as_serve_refuses_it(tmp_path, capsys) -> None:
    # sqlite://x.db was read as ./x.db by `store` (and said "no store") while `serve` refused it
    for url in ("sqlite://x.db", "jsonl://dir"):
        assert main(["store", "list", "--store", url], settings=Settings()) == 2
        assert "(no host)" in capsys.readouterr().err, url


def test_an_unknown_session_is_a_clear_error(tmp_path, capsys) -> None:
    store = f"sqlite:///{tmp_path}/gw.db"
    assert main(["demo", "--store", store], settings=Settings()) == 0
    capsys.readouterr()
    assert main(["store", "nope", "--store", store], settings=Settings()) == 1
    assert "session 'nope' does not exist" in capsys.readouterr().err


def test_no_command_is_the_service_as_scripts_run_has_it(tmp_path, capsys) -> None:
    """`gateway` alone said "the following arguments are required: command", while the README
    has `gateway <command>` the same as `scripts/run <command>`, which serves."""
    with _a_taken_port() as port:
        assert (
            main([], settings=_sqlite(tmp_path, port=port)) == 2
        )  # it tried to serve: the port is taken
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"gateway: cannot listen on 127.0.0.1:{port}")


def test_store_list_and_show_as_the_readme_and_the_demo_say(tmp_path, capsys) -> None:
    store = f"sqlite:///{tmp_path}/gw.db"
    assert main(["demo", "--store", store], settings=Settings()) == 0
    hint = capsys.readouterr().out.strip().splitlines()[-1]
    assert hint.startswith("inspect it again: gateway store show ")
    command = hint.removeprefix("inspect it again: gateway ").split()
    assert main(command, settings=Settings()) == 0  # the demo's own hint works
    shown = capsys.readouterr().out
    assert "lane main" in shown and "operation_finished" in shown
    assert main(["store", "list", "--store", store], settings=Settings()) == 0
    listed = capsys.readouterr().out.strip().splitlines()
    assert len(listed) == 1 and listed[0].split()[0] == command[2]
    assert main(["store", "show", "--store", store], settings=Settings()) == 2
    assert "usage: gateway store" in capsys.readouterr().err
    # the option before the session (the README: "before or after the command") said
    # "unrecognized arguments: <session>"
    assert main(["store", "show", "--store", store, command[2]], settings=Settings()) == 0
    assert "lane main" in capsys.readouterr().out
    with pytest.raises(SystemExit) as usage:  # as argparse ends any usage error
        main(["store", "show", "--store", store, command[2], "--bogus"])
    assert usage.value.code == 2 and "unrecognized arguments" in capsys.readouterr().err
    assert main(["ask", "--store", store, "hi"], settings=Settings()) == 0  # session "cli"
    capsys.readouterr()
    assert main(["store", "list", "--store", store], settings=Settings()) == 0
    listed = capsys.readouterr().out.splitlines()
    assert "cli" in listed  # a session without a name is its id alone
    assert all(line == line.rstrip() for line in listed)


def test_a_redis_that_refuses_both_store_and_broker_is_one_line(tmp_path, capsys) -> None:
    """A wrong password for the one Redis: it was two lines saying "does not answer"."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # nothing listens there
    url = f"redis://:hunter2@127.0.0.1:{port}/0"
    settings = gateway_settings(redis_url=url, web_url=f"sqlite:///{tmp_path}/w.db")
    assert main(["serve", "--port", str(_free_port())], settings=settings) == 1
    err = capsys.readouterr().err
    [refusal] = [line for line in err.splitlines() if line.startswith("gateway: ")]
    assert refusal.startswith(
        f"gateway: the broker and the store at redis://:***@127.0.0.1:{port}/0 cannot be used ("
    )
    assert "hunter2" not in err


def test_serve_with_a_broker_that_does_not_answer_stops_with_one_line(tmp_path, capsys) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # nothing listens there
    settings = gateway_settings(
        store_url=f"sqlite:///{tmp_path}/s.db",
        broker_url=f"redis://:hunter2@127.0.0.1:{port}/0",
        web_url=f"sqlite:///{tmp_path}/w.db",
    )
    assert main(["serve", "--port", str(_free_port())], settings=settings) == 1
    err = capsys.readouterr().err
    refusal = [line for line in err.splitlines() if line.startswith("gateway: the broker")]
    assert len(refusal) == 1
    assert refusal[0].startswith(
        f"gateway: the broker at redis://:***@127.0.0.1:{port}/0 cannot be used (BrokerError: "
    )
    assert f"127.0.0.1:{port}" in refusal[0].split("(", 1)[1]  # why: which address refused
    assert "hunter2" not in err
    assert "Traceback" not in err
    assert "service started" not in err  # refused before any adapter or worker began


@pytest.mark.parametrize("where", ["before serve", "after serve"])
def test_serve_takes_the_store_flag_wherever_it_is_given(tmp_path, capsys, where: str) -> None:
    settings = gateway_settings(
        store_url=f"sqlite:///{tmp_path}/s.db",
        broker_url=f"sqlite:///{tmp_path}/b.db",
        web_url="memory://",
    )
    flag = ["--store", "sqlite:////proc/gateway-test-nowhere/s.db"]
    serve = ["serve", "--port", str(_free_port())]
    words = [*flag, *serve] if where == "before serve" else [*serve, *flag]
    assert main(words, settings=settings) == 1  # the flag's store, not the settings' one
    err = capsys.readouterr().err
    assert "gateway: the store at sqlite:////proc/gateway-test-nowhere/s.db" in err


def test_serve_with_a_store_directory_that_cannot_be_made_names_it(tmp_path, capsys) -> None:
    # /proc refuses new directories (ENOENT) even to root: the failure comes at the first use
    settings = gateway_settings(
        store_url="sqlite:////proc/gateway-test-nowhere/s.db",
        broker_url=f"sqlite:///{tmp_path}/b.db",
        web_url="memory://",
    )
    assert main(["serve", "--port", str(_free_port())], settings=settings) == 1
    err = capsys.readouterr().err
    refusal = [line for line in err.splitlines() if line.startswith("gateway: ")]
    assert refusal == [  # a SessionError, as the store's contract says (D191), naming the cause
        "gateway: the store at sqlite:////proc/gateway-test-nowhere/s.db cannot be used "
        "(SessionError: sqlite error on /proc/gateway-test-nowhere/s.db: "
        "[Errno 2] No such file or directory: '/proc/gateway-test-nowhere')"
    ]
    assert "Traceback" not in err


def _free_port() -> int:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        return int(free.getsockname()[1])


@pytest.mark.parametrize("words", [["store"], ["store", "list"], ["store", "show", "s1"]])
def test_reading_a_store_that_is_not_there_creates_nothing(tmp_path, capsys, words) -> None:
    for url in (f"sqlite:///{tmp_path}/none/gw.db", f"jsonl:///{tmp_path}/none"):
        assert main([*words, "--store", url], settings=Settings()) == 2
        err = capsys.readouterr().err
        assert err.startswith("gateway: no store at ") and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []
    empty = tmp_path / "empty.db"  # `touch`ed, or cut short: SQLite wrote its schema into it
    empty.touch()
    assert main([*words, "--store", f"sqlite:///{empty}"], settings=Settings()) == 2
    assert f"no store at {empty} (an empty file)" in capsys.readouterr().err
    assert empty.stat().st_size == 0


@pytest.mark.parametrize("words", [["store", "list"], ["store", "check"]])
def test_another_program_s_database_is_refused_and_left_as_it_was(tmp_path, capsys, words) -> None:
    """`store check` added the gateway's eleven tables to a mistyped URL's database (another
    program's), then said "clean" (an outside probe)."""
    foreign = tmp_path / "crm.db"
    with contextlib.closing(sqlite3.connect(foreign)) as db:
        db.execute("CREATE TABLE users (id INTEGER, name TEXT)")
        db.commit()
    before = foreign.read_bytes()
    assert main([*words, "--store", f"sqlite:///{foreign}"], settings=Settings()) == 1
    err = capsys.readouterr().err
    assert err == (
        f"gateway: {foreign} is not a gateway session store: it holds other tables (users); "
        "nothing was written to it\n"
    )
    assert foreign.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["crm.db"]  # no -wal, no -shm


class _Refusal(GatewayError):
    """A gateway error `main` has never heard of by name."""

    @property
    def exit_status(self) -> int:
        return 3


class _ChannelTrouble(AdapterError):
    """A channel's error that reaches the command."""


@pytest.mark.parametrize(
    ("error", "status", "line"),
    [
        (_Refusal("the lane is held\nelsewhere"), 3, "gateway: the lane is held elsewhere\n"),
        (_ChannelTrouble("the channel refused"), 1, "gateway: the channel refused\n"),
        (SessionError("storage", "the store is gone"), 1, "gateway: the store is gone\n"),
    ],
)
def test_main_catches_the_roots_in_one_line_with_the_errors_status(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    error: Exception,
    status: int,
    line: str,
) -> None:
    """Any error under a package's root is one line and its status, not an "unexpected error"."""

    async def failing(args: object, settings: Settings) -> int:
        raise error

    monkeypatch.setattr(cli, "_run", failing)
    assert main(["store"], settings=Settings()) == status
    assert capsys.readouterr().err == line


def test_an_unknown_command_is_named(capsys) -> None:
    # `scripts/run frobnicate` runs `serve frobnicate`: it said "unrecognized arguments"
    with pytest.raises(SystemExit) as usage:
        main(["serve", "frobnicate"], settings=Settings())
    assert usage.value.code == 2
    err = capsys.readouterr().err
    assert "unknown command 'frobnicate' (the commands: demo, store, ask, ops, serve)" in err


def test_an_ask_lane_named_like_a_channel_s_thread_is_refused(tmp_path, capsys) -> None:
    # `ask --lane web:hello` made a conversation in session cli beside the web thread
    store = f"sqlite:///{tmp_path}/gw.db"
    assert main(["ask", "--store", store, "--lane", "web:hello", "hi"], settings=Settings()) == 2
    err = capsys.readouterr().err
    assert "lane 'web:hello' is named like a web thread" in err and "--lane cli:NAME" in err
    assert not (tmp_path / "gw.db").exists()  # refused before the store is opened
    assert main(["ask", "--store", store, "--lane", "notes:monday", "hi"], settings=Settings()) == 0
    assert "You said: hi" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["demo", "store", "ask", "serve"])
def test_each_command_s_help_says_what_it_does_and_what_store_means(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`serve --help` said nothing of what it does, and `--store` read "(as above)" with
    nothing above it (or no text at all)."""
    with pytest.raises(SystemExit) as ended:
        main([name, "--help"], settings=Settings())
    assert ended.value.code == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "as above" not in said
    assert "--store STORE store URL (default: $GATEWAY_STORE_URL or" in said
    description = said.split("options:")[0].split("positional arguments:")[0].split("] ")[-1]
    assert description[:1].isupper() and description.rstrip().endswith("."), said


@pytest.mark.parametrize(
    "words",
    [
        ["ask", "hello", "-x"],
        ["serve", "--port", "nan"],
        ["serve", "--log-level", "LOUD"],
        ["frobnicate"],
        ["ops", "--timeout", "nan", "lanes"],
        ["ops", "abort", "web:x", "--yes", "--idempotency-key", "café"],
        ["ops", "abort", "web:x", "--yes", "--idempotency-key", "a\nb"],
        # the first of two was never read, and an empty one meant the default (a probe)
        ["--config", "a.toml", "--config", "b.toml", "store", "list"],
        ["store", "list", "--store=sqlite:///a.db", "--store", "sqlite:///b.db"],
        ["--store", "", "store", "list"],
        ["--config=", "ask", "hi"],
        ["ops", "lanes", "--url", ""],
        ["ops", "--token", "a", "lanes", "--token", "b"],
    ],
)
def test_a_usage_error_is_one_line_that_says_where_help_is(
    words: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """argparse printed the whole usage, then the error: three to six lines where the rule is
    one; and an idempotency key with a newline read "cannot reach the gateway" (exit 3, which
    a retrying script took for an outage) (an outside probe)."""
    code: int | str | None
    try:
        code = main(words, settings=Settings())
    except SystemExit as exited:
        code = exited.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("gateway") and err.endswith("--help` shows how)\n"), err
