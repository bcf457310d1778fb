"""The ``gateway`` command: the service (`serve`), the crash demo, store inspection, `ask`."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from config import Settings, SettingsError, format_settings_error, load_settings
from gateway.ask import ask
from gateway.broker import BrokerError
from gateway.demo import demo, describe
from gateway.models import ModelConfigError
from gateway.plugin import PluginError
from harness_core import (
    HarnessError,
    SessionRepo,
    open_repo,
)

__all__ = ["main"]


async def show(repo: SessionRepo, session_id: str | None, out: list[str]) -> None:
    """List sessions, or print one session's lanes and log."""
    if session_id is None:
        for meta in await repo.list():
            out.append(f"{meta.id}  {meta.name or ''}")
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


def _session_of(target: Sequence[str]) -> str | None:
    """`list` / nothing lists sessions; `show SESSION` (or just `SESSION`) shows one."""
    words = list(target)
    if words in ([], ["list"]):
        return None
    if len(words) == 2 and words[0] == "show":
        return words[1]
    if len(words) == 1 and words[0] != "show":
        return words[0]
    raise CliError("usage: gateway store [list | show SESSION] [--store URL]")


def _missing_local_store(url: str) -> str | None:
    """The path of a file or directory store that does not exist (reading must not create it)."""
    scheme, _, rest = url.partition("?")[0].partition("://")
    if scheme not in ("sqlite", "jsonl"):
        return None
    path = Path(rest[1:] if rest.startswith("/") else rest).expanduser()
    return None if path.exists() else str(path)


class CliError(Exception):
    """A command line that names no valid action (reported as one line, status 2)."""


async def _run(args: argparse.Namespace, settings: Settings) -> int:
    if args.command == "serve":
        from gateway.serve import serve

        return await serve(settings)
    url = args.store or settings.effective_store_url
    if args.command == "store" and (missing := _missing_local_store(url)) is not None:
        raise CliError(f"no store at {missing} (gateway serve creates it; --store URL for another)")
    repo = open_repo(url)
    out: list[str] = []
    try:
        if args.command == "demo":
            session_id = await demo(repo, url, out)
            out.append(f"inspect it again: gateway store show {session_id} --store {url}")
        elif args.command == "store":
            await show(repo, _session_of(args.target), out)
        else:
            return await ask(repo, settings, args.lane, " ".join(args.question), out)
    finally:
        await repo.close()
        print("\n".join(out))
    return 0


def main(argv: Sequence[str] | None = None, settings: Settings | None = None) -> int:
    """Run the ``gateway`` command; returns the exit status."""
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["ops"]:  # the operator client has its own parser (gateway ops --help)
        from gateway.ops.cli import main as ops_main

        return ops_main(words[1:], settings)
    parser = argparse.ArgumentParser(
        prog="gateway", description="A durable LLM agent gateway for Slack and email."
    )
    parser.add_argument(
        "--store", help="store URL (default: $GATEWAY_STORE_URL or sqlite:///.gateway/gateway.db)"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="run two threads, crash one mid-tool, recover it")
    store = commands.add_parser(
        "store",
        help="list sessions, or show one session's lanes and log",
        usage="gateway store [list | show SESSION] [--store URL]",
    )
    store.add_argument("target", nargs="*", help="list (the default), or show SESSION")
    store.add_argument("--store", dest="store", default=argparse.SUPPRESS)
    demo_parser = commands.choices["demo"]
    demo_parser.add_argument("--store", dest="store", default=argparse.SUPPRESS)
    ask_parser = commands.add_parser(
        "ask", help="ask the configured model (GATEWAY_MODEL; scripted:echo by default)"
    )
    ask_parser.add_argument("question", nargs="+")
    ask_parser.add_argument("--lane", default="cli:default", help="the lane (conversation) to use")
    ask_parser.add_argument("--store", dest="store", default=argparse.SUPPRESS)
    commands.add_parser(
        "ops",
        help="operate a running gateway over its API: lanes, timelines, resume, approve "
        "(gateway ops --help)",
    )
    serve_parser = commands.add_parser(
        "serve", help="run the service: the web channel, workers and deliverer (embedded default)"
    )
    serve_parser.add_argument("--config", help="a TOML settings file (the environment wins)")
    serve_parser.add_argument("--host", help="listen address (default: GATEWAY_HOST or 127.0.0.1)")
    serve_parser.add_argument("--port", type=int, help="listen port (default: 8787)")
    serve_parser.add_argument(
        "--log-level", choices=("debug", "info", "warning", "error"), help="log verbosity"
    )
    args = parser.parse_args(argv)
    try:
        if settings is None:
            settings = load_settings(config_file=getattr(args, "config", None))
        overrides = {
            name: value
            for name in ("host", "port", "log_level")
            if (value := getattr(args, name, None)) is not None
        }
        if overrides:
            settings = settings.replace(**overrides)
    except (SettingsError, ValidationError) as exc:
        print(f"gateway: {format_settings_error(exc)}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_run(args, settings))
    except (HarnessError, ModelConfigError, PluginError, BrokerError) as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 1
    except CliError as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
