"""The ``gateway`` command: the service, the crash demo, store inspection and check, `ask`.

``serve`` runs the service, ``store check`` is the store's fsck (`gateway.store_check`).

Whatever goes wrong is one line on stderr, ``gateway: ...``, and a non-zero exit status, never
a traceback: 2 for a command line or settings that cannot work, 1 for a failure (the store,
the model, the session held by another process), 130 for Ctrl-C. Output cut short by its
reader (``gateway store show S | head -1``) ends quietly, with status 141 as a shell reports
for ``cat`` there. ``GATEWAY_LOG_LEVEL=debug`` adds the traceback of an unexpected error.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sqlite3
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from adapters import AdapterError, text_problem
from config import Settings, SettingsError, format_settings_error
from gateway.ask import SESSION as ASK_SESSION
from gateway.ask import ask, terminal
from gateway.channels import load_gateway_settings
from gateway.demo import demo, describe
from gateway.errors import GatewayError, StatusError
from gateway.event_loop import loop_factory
from gateway.invocation import OneLineParser, command
from gateway.redact import Redactor
from gateway.store_check import PROBLEMS_FOUND, store_check
from harness_core import (
    HarnessError,
    SessionError,
    SessionRepo,
    open_repo,
)
from harness_core.backends.urls import without_password
from harness_core.session.names import check_lane_name, check_session_id

__all__ = ["main"]

INTERRUPTED = 130
"""Ctrl-C (128 + SIGINT), as shells report it."""
OUTPUT_CLOSED = 141
"""The reader of our output went away (128 + SIGPIPE), as shells report it for ``cat``."""


async def show(repo: SessionRepo, session_id: str | None, out: list[str]) -> None:
    """List sessions, or print one session's lanes and log."""
    if session_id is None:
        for meta in await repo.list():
            out.append(f"{meta.id}  {meta.name}" if meta.name else meta.id)
        return
    storage = await repo.open(session_id)
    for pointer in await storage.get_lanes():
        state = (
            "open operation"
            if await storage.find_open_operations(pointer.lane, limit=1)
            else "idle"
        )
        out.append(f"lane {pointer.lane:<34} leaf={pointer.leaf_id} ({state})")
    for item in await storage.get_log():
        out.append(f"  {item.seq:>3} {describe(item)}")


async def _known_sessions(repo: SessionRepo, sessions: Sequence[str]) -> None:
    """Refuse a session name that is none, or no session of the store, before a check.

    A mistyped name was reported as a problem found, exit 4, which a monitoring job reads as a
    damaged store (an outside probe).
    """
    for name in sessions:
        check_session_id(name)  # SessionError("invalid_session_id"): a usage line, 2
    if sessions:
        known = {meta.id for meta in await repo.list()}
        for name in sessions:
            if name not in known:
                raise CliError(
                    f"session {name!r} does not exist (`{command()} store list` lists them)",
                    status=1,
                )


def _store_words(target: Sequence[str]) -> tuple[str, list[str]]:
    """What ``store`` was asked: list, show one session, or check (all or the named ones).

    `list` / nothing lists sessions; `show SESSION` (or just `SESSION`) shows one;
    `check [SESSION...]` checks them all (or those).
    """
    words = list(target)
    if words in ([], ["list"]):
        return "list", []
    if words[0] == "check":
        return "check", words[1:]
    if len(words) == 2 and words[0] == "show":
        return "show", words[1:]
    if len(words) == 1 and words[0] != "show":
        return "show", words
    raise CliError(f"usage: {STORE_USAGE}")


STDIN_QUESTION_BYTES = 1 << 20
"""The most of standard input `ask -` reads as its question."""


def _question_from_stdin() -> str:
    """`ask -`: the question is standard input (to its end), as UTF-8 text."""
    if sys.stdin is None:  # started with its standard input closed (`<&-`)
        raise CliError("there is no standard input to read the question from (it was closed)")
    data = sys.stdin.buffer.read(STDIN_QUESTION_BYTES + 1)
    if len(data) > STDIN_QUESTION_BYTES:
        raise CliError(
            f"the question on standard input is longer than {STDIN_QUESTION_BYTES} bytes"
        )
    try:
        return data.decode("utf-8").removesuffix("\n")
    except UnicodeDecodeError:
        raise CliError("the question on standard input is not UTF-8 text") from None


def _missing_local_store(url: str) -> str | None:
    """The path of a file or directory store that does not exist (reading must not create it)."""
    scheme, _, rest = url.partition("?")[0].partition("://")
    if scheme not in ("sqlite", "jsonl") or not rest.startswith("/"):
        return None  # not a local store, or a malformed URL: opening it says which
    path = Path(rest[1:]).expanduser()
    if scheme == "sqlite" and path.is_file() and path.stat().st_size == 0:
        return f"{path} (an empty file)"  # SQLite would write its schema into it
    return None if path.exists() else str(path)


STORE_USAGE = f"{command()} store [list | show SESSION | check [SESSION...]] [--store URL]"


class CliError(StatusError):
    """A command that cannot be done: one line on stderr, and `status` (2: the command line)."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message, status)


class _OutputClosed(GatewayError):
    """Writing to stdout failed because its reader is gone (a closed pipe)."""


class _OutputFailed(GatewayError):
    """Writing to stdout failed otherwise (none, or a full disk): what was asked is stored."""


def _not_a_channel_lane(lane: str) -> None:
    """Refuse an `ask` lane named like a channel's thread (``web:hello``).

    `ask` keeps its lanes in its own session (``cli``): ``--lane web:hello`` made a new
    conversation there, beside the web thread it seemed to continue.
    """
    prefix, colon, _ = lane.partition(":")
    if not colon or prefix == "cli":
        return
    from adapters import channel_specs  # only here: the adapters take 0.4 s to import

    if prefix in {spec.name for spec in channel_specs()}:
        raise CliError(
            f"lane {lane!r} is named like a {prefix} thread, which `serve` answers; `ask` keeps "
            f"its own conversations (session {ASK_SESSION}): --lane cli:NAME, or "
            f"`{command()} ops timeline {lane}` to read that thread"
        )


async def _run(args: argparse.Namespace, settings: Settings) -> int:
    if args.command == "serve":
        from gateway.serve import serve

        return await serve(settings)
    # the demo's sessions are a demo's: kept out of the store `serve` uses, unless named
    url = args.store or (DEMO_STORE if args.command == "demo" else settings.effective_store_url)
    if args.command == "ask" and args.question == ["-"]:
        args.question = [_question_from_stdin()]
    if args.command == "ask" and args.question and not " ".join(args.question).strip():
        raise CliError("the question is empty (the web channel refuses empty text too)")
    if args.command == "ask" and args.question:
        problem = text_problem(" ".join(args.question), "the question")
        if problem is not None:  # bytes that are no UTF-8 arrive as lone surrogates
            raise CliError(f"{problem} (the web channel refuses it too)")
    if args.command == "store" and (missing := _missing_local_store(url)) is not None:
        raise CliError(
            f"no store at {missing} ({command()} serve creates it; --store URL for another)"
        )
    if args.command == "ask":
        try:
            check_lane_name(args.lane)
        except SessionError as exc:
            raise CliError(str(exc)) from None  # a name on the command line: usage, 2
        _not_a_channel_lane(args.lane)
    try:
        repo = open_repo(url, reads_only=args.command == "store")
    except SessionError as exc:
        if exc.code == "invalid_query":  # the URL itself: the command line's, as serve's is
            raise CliError(str(exc)) from None
        raise
    out: list[str] = []
    notes: list[str] = []  # after the output, on stderr: what a pipe should not read
    try:
        if args.command == "demo":
            run = await demo(repo, url, out)
            out.append(f"inspect it again: {command()} store show {run.session} --store {url}")
        elif args.command == "store":
            what, sessions = _store_words(args.target)
            if what == "check":
                try:
                    await _known_sessions(repo, sessions)
                    return await store_check(repo, sessions, out)
                except (SessionError, sqlite3.Error) as exc:
                    damage = _damage(exc)
                    if damage is None:
                        raise
                    # what the check is for: a finding (4), not a store it could not use (1)
                    out.append(f"problem: {without_password(url)}: {damage}")
                    out.append("checked: the file is damaged (restore it from a backup)")
                    return PROBLEMS_FOUND
            await show(repo, sessions[0] if sessions else None, out)
        else:
            question = " ".join(args.question)
            return await ask(repo, settings, args.lane, question, out, terminal(), notes)
    except (SessionError, sqlite3.Error, OSError) as exc:  # the store's file cannot be used
        if isinstance(exc, SessionError) and exc.code in ("invalid_lane", "invalid_session_id"):
            raise CliError(str(exc)) from None  # a name on the command line: usage, 2
        cause = exc.__cause__ if isinstance(exc, SessionError) else exc
        if not isinstance(cause, sqlite3.Error | OSError):
            raise
        raise CliError(
            f"cannot use the store {without_password(url)}: {_store_problem(cause)}", status=1
        ) from exc
    finally:
        await repo.close()
        redactor = Redactor.from_settings(settings)  # a record stored before redaction existed
        try:
            _write([redactor.redact(line) for line in out], escaped=args.command == "store")
        except _OutputFailed as exc:
            if args.command != "ask":
                raise
            # the turn is stored: say where to read it, rather than leave it seeming lost
            raise _OutputFailed(
                f"{exc}; the answer is stored (`{command()} store show {ASK_SESSION}` shows "
                f"lane {args.lane})"
            ) from None
        if notes and sys.stderr is not None:  # closed (`2>&-`): print would write to stdout
            print("\n".join(notes), file=sys.stderr, flush=True)
    return 0


def _damage(exc: SessionError | sqlite3.Error) -> str | None:
    """SQLite's words when it found the file's pages damaged (SQLITE_CORRUPT), else None."""
    cause = exc.__cause__ if isinstance(exc, SessionError) else exc
    if isinstance(cause, sqlite3.Error) and cause.sqlite_errorname == "SQLITE_CORRUPT":
        return f"SQLite cannot read it: {cause}"
    return None


def _store_problem(exc: sqlite3.Error | OSError) -> str:
    """What SQLite or the file system said, and what it most likely means."""
    if isinstance(exc, OSError):
        where = f": {exc.filename}" if exc.filename else ""
        return f"{exc.strerror or exc}{where}"
    said = str(exc)
    hint = {
        "file is not a database": "damaged, or not a SQLite file",
        "attempt to write a readonly database": "the file cannot be written",
        "unable to open database file": "its directory cannot be written, or is no directory",
        "disk I/O error": "the disk is full or failing, or the file cannot be written",
    }.get(said)
    return f"{said} ({hint})" if hint else said


def _write(out: list[str], *, escaped: bool = False) -> None:
    """Print `out`; its control characters written as escapes on a terminal, or always.

    `escaped`: whatever reads it (`store show | less -R` passed a message's escape sequences to
    the terminal, an outside probe; `ops timeline` escapes them always too). An `ask`'s answer
    piped elsewhere is left as the model wrote it.
    """
    if not out:
        return
    text = "\n".join(out)
    if sys.stdout is None:  # started with its standard output closed (`>&-`)
        raise _OutputFailed("there is no standard output to write to (it was closed)")
    if escaped or sys.stdout.isatty():  # escape sequences in a message: shown, not obeyed
        text = _ESCAPES.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    try:
        print(text, flush=True)
    except BrokenPipeError:
        raise _OutputClosed from None
    except OSError as exc:  # a full disk, /dev/full, an I/O error: said once, in words
        why = os.strerror(exc.errno) if exc.errno else type(exc).__name__
        raise _OutputFailed(f"cannot write to standard output ({why})") from None


_ESCAPES = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""What a terminal would act on (cursor moves, colours, a title, a hyperlink): every control
character but newline and tab. A model's answer or a stored message is someone else's text."""


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real descriptor (captured), or none
        pass


def _leading_options(words: Sequence[str]) -> list[str]:
    """The ``--config FILE`` / ``--store URL`` (or ``--x=value``) words before the command."""
    taken: list[str] = []
    index = 0
    while index < len(words):
        word = words[index]
        if word.startswith(("--config=", "--store=")):
            taken.append(word)
            index += 1
        elif word in ("--config", "--store") and index + 1 < len(words):
            taken += words[index : index + 2]
            index += 2
        else:
            break
    return taken


DEMO_STORE = "sqlite:///.gateway/demo.db"
"""Where `demo` keeps its sessions when no ``--store`` names a store (not the live one)."""
_COMMAND_WORDS = frozenset({"demo", "store", "ask", "ops", "serve", "-h", "--help"})
"""A word that makes a command line not the service's (`scripts/run` checks the same)."""


def main(argv: Sequence[str] | None = None, settings: Settings | None = None) -> int:
    """Run the ``gateway`` command; returns the exit status."""
    words = list(sys.argv[1:] if argv is None else argv)
    if not _COMMAND_WORDS & set(words):
        # no command (only options, like --port 9000): the service, as `scripts/run` does
        words = ["serve", *words]
    leading = _leading_options(words)
    if words[len(leading) : len(leading) + 1] != ["ops"]:  # `ops` checks its own
        try:
            OneLineParser(prog=command()).check_given(words, ("--config", "--store"))
        except SystemExit as exc:  # said on one line
            return exc.code if isinstance(exc.code, int) else 2
    if words[len(leading) : len(leading) + 1] == ["ops"]:
        # the operator client has its own parser (gateway ops --help); `--config`/`--store`
        # before `ops` are its own too ("unrecognized arguments: mcp" said nothing of that)
        from gateway.ops.cli import main as ops_main

        return ops_main([*words[len(leading) + 1 :], *leading], settings)
    parser = OneLineParser(
        prog=command(),
        description="A durable LLM agent gateway for Slack, email, the web and webhooks.",
    )
    store_help = "store URL (default: $GATEWAY_STORE_URL or sqlite:///.gateway/gateway.db)"
    parser.add_argument("--store", help=store_help)
    config_help = "a TOML settings file (the environment wins): every command reads the same"
    parser.add_argument("--config", help=config_help)
    commands = parser.add_subparsers(dest="command", required=True)
    said = "run two threads, crash one mid-tool, recover it"
    commands.add_parser("demo", help=said, description=said[0].upper() + said[1:] + ".")
    said = "list sessions, show one session's lanes and log, or check the store (fsck)"
    store = commands.add_parser(
        "store", help=said, description=said[0].upper() + said[1:] + ".", usage=STORE_USAGE
    )
    store.add_argument(
        "target",
        nargs="*",
        help="list (the default), show SESSION, or check [SESSION...]: every stored item "
        "validated and its checksum verified, projections compared with the log (exit 4 "
        "when a problem is found)",
    )
    store.add_argument("--store", dest="store", default=argparse.SUPPRESS, help=store_help)
    demo_parser = commands.choices["demo"]
    demo_parser.add_argument("--store", dest="store", default=argparse.SUPPRESS, help=store_help)
    for reading in (store, demo_parser):
        # `ask`, `store` and `demo` ignored the TOML file `serve` was given: another store,
        # and for `ask` another agent (no plugin, no MCP servers)
        reading.add_argument("--config", default=argparse.SUPPRESS, help=config_help)
    said = (
        "ask the configured agent (GATEWAY_MODEL, scripted:echo by default, with "
        "GATEWAY_PLUGIN's and the MCP servers' tools; a call that needs approval is put to "
        "you at the terminal)"
    )
    ask_parser = commands.add_parser("ask", help=said, description=said[0].upper() + said[1:] + ".")
    ask_parser.add_argument(
        "question",
        nargs="*",
        help="what to ask (-: read it from standard input; none: only continue what the lane "
        "left open, such as a run waiting for approval)",
    )
    ask_parser.add_argument("--lane", default="cli:default", help="the lane (conversation) to use")
    ask_parser.add_argument("--store", dest="store", default=argparse.SUPPRESS, help=store_help)
    ask_parser.add_argument("--config", default=argparse.SUPPRESS, help=config_help)
    commands.add_parser(
        "ops",
        help="operate a running gateway over its API: lanes, timelines, resume, approve "
        f"({command()} ops --help)",
    )
    said = (
        "run the service: the web channel, workers and deliverer (embedded default; also what "
        f"{command()} with no command, or options only, does)"
    )
    serve_parser = commands.add_parser(
        "serve", help=said, description=said[0].upper() + said[1:] + "."
    )
    serve_parser.add_argument("--config", default=argparse.SUPPRESS, help=config_help)
    serve_parser.add_argument("--store", dest="store", default=argparse.SUPPRESS, help=store_help)
    serve_parser.add_argument("--host", help="listen address (default: GATEWAY_HOST or 127.0.0.1)")
    serve_parser.add_argument(
        "--port", type=int, help="listen port (default: GATEWAY_PORT or 8787)"
    )
    serve_parser.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        help="the least severe log lines written (default: GATEWAY_LOG_LEVEL or info)",
    )
    args, extra = parser.parse_known_args(words)
    if extra:
        # `store show --store URL SESSION`: argparse ends a positional list at an option, so
        # the words after it are the same list's (the README says "before or after")
        listed = {"store": "target", "ask": "question"}.get(args.command)
        if args.command == "serve" and not extra[0].startswith("-"):
            # `scripts/run frobnicate` is `serve frobnicate` (no command: the service)
            parser.error(
                f"unknown command {extra[0]!r} (the commands: {', '.join(commands.choices)})"
            )
        if listed is None or any(word.startswith("-") for word in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        setattr(args, listed, [*getattr(args, listed), *extra])
    try:
        if settings is None:
            settings = load_gateway_settings(config_file=getattr(args, "config", None))
        overrides = {
            name: value
            for name in ("host", "port", "log_level")
            if (value := getattr(args, name, None)) is not None
        }
        if args.command == "serve" and getattr(args, "store", None) is not None:
            overrides["store_url"] = args.store  # the other commands read --store themselves
        if overrides:
            settings = settings.replace(**overrides)
    except (SettingsError, ValidationError) as exc:
        print(f"gateway: {format_settings_error(exc)}", file=sys.stderr)
        return 2
    redact = Redactor.from_settings(settings).redact
    try:
        # `serve` on uvloop where it is installed (D276); the short commands on asyncio's own
        factory = loop_factory(settings.event_loop) if args.command == "serve" else None
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(_run(args, settings))
    except (_OutputClosed, BrokenPipeError):  # before the root: a closed pipe says nothing
        _discard_stdout()
        return OUTPUT_CLOSED
    except _OutputFailed as exc:
        _discard_stdout()  # what is still buffered would fail again at exit ("Exception ignored")
        return _fail(str(exc), 1)
    except GatewayError as exc:
        return _fail(redact(str(exc)), exc.exit_status)
    except (HarnessError, AdapterError) as exc:  # the engine's and the channels' roots
        return _fail(redact(str(exc)), 1)
    except (KeyboardInterrupt, asyncio.CancelledError):
        return _fail("interrupted", INTERRUPTED)
    except Exception as exc:  # a defect: still one line (the traceback with log_level debug)
        if settings.log_level == "debug":
            traceback.print_exc()
        return _fail(redact(f"unexpected error: {type(exc).__name__}: {exc}"), 1)


def _fail(message: str, status: int) -> int:
    print(f"gateway: {' '.join(message.split())}", file=sys.stderr)
    return status
