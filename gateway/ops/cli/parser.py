"""The ``gateway ops`` command line: its options, its commands and their arguments."""

from __future__ import annotations

import argparse
import re
from typing import Any

from adapters import whole_number
from gateway.budgets import MAX_BUDGET
from gateway.invocation import OneLineParser
from gateway.invocation import command as typed_command
from gateway.ops.cli import actions, reads
from gateway.ops.cli.run import Handler
from gateway.ops.cli.target import TOKEN_VARIABLE, URL_VARIABLE

__all__ = ["build_parser"]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return value


def _key(text: str) -> str:
    """An Idempotency-Key as the API takes it: 1-512 visible ASCII characters."""
    if not re.fullmatch(r"[!-~]{1,512}", text):
        # a newline read "cannot reach the gateway" (exit 3: a retrying script never stopped)
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r}{'...' if len(text) > 40 else ''} is no key: 1-512 visible ASCII "
            "characters (no spaces)"
        )
    return text


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most 3600, not {text}")
    return value


def _global_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """The options every command takes, before or after its name."""

    def default(value: Any) -> Any:
        return value if defaults else argparse.SUPPRESS

    group = parser.add_argument_group("connection and output")
    group.add_argument(
        "--url",
        default=default(None),
        help=f"the gateway, like http://127.0.0.1:8787 (default: ${URL_VARIABLE}, else the "
        "host and port in the settings gateway serve reads)",
    )
    group.add_argument(
        "--token",
        default=default(None),
        help=f"an operator or viewer token (default: ${TOKEN_VARIABLE}, else the token a local "
        "gateway without ops_tokens keeps beside its store)",
    )
    group.add_argument(
        "--json",
        action="store_true",
        default=default(False),
        help="print the API's JSON (for scripts)",
    )
    group.add_argument(
        "--timeout",
        type=_seconds,
        default=default(30.0),
        metavar="SECONDS",
        help="how long to wait for the gateway (default: 30)",
    )
    group.add_argument(
        "--config",
        default=default(None),
        metavar="FILE",
        help="the TOML settings file gateway serve reads (for its address and token file)",
    )
    group.add_argument(
        "--store",
        default=default(None),
        metavar="URL",
        help="the store gateway serve was given (--store), for the token file it keeps beside it",
    )


def build_parser() -> OneLineParser:
    """The ``gateway ops`` parser: global options, and one subcommand per command."""
    common = OneLineParser(add_help=False)
    _global_options(common, defaults=False)
    parser = OneLineParser(
        prog=f"{typed_command()} ops",
        description="Operate a running gateway over its operator API: list lanes, read their "
        "timelines, resume, approve, abort. A LANE is its id (ln_...), its name (web:hello, "
        "slack:C1:123.4) or SESSION/LANE.",
        epilog="Exit status: 0 done, 1 refused or failed, 2 usage (or --yes needed), "
        "3 the gateway cannot be reached, 130 interrupted.",
    )
    _global_options(parser, defaults=True)
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", title="commands"
    )

    def command(name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text, parents=[common])
        sub.set_defaults(handler=handler)
        return sub

    def lane_argument(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("lane", metavar="LANE", help="ln_... id, lane name, or SESSION/LANE")

    def acting(sub: argparse.ArgumentParser, *, confirm: bool) -> None:
        sub.add_argument(  # on every acting command: a script passes it to all of them
            "-y",
            "--yes",
            action="store_true",
            help="do not ask (required without a terminal)"
            if confirm
            else "accepted for scripts: this command does not ask",
        )
        sub.add_argument(
            "--idempotency-key",
            type=_key,
            metavar="KEY",
            help="the action's Idempotency-Key (default: a new one): the same key repeats "
            "nothing, it answers with the first result",
        )

    def recovery(sub: argparse.ArgumentParser) -> None:
        sub.add_argument(
            "--tool-recovery",
            choices=("declared", "never", "always"),
            default="declared",
            help="what becomes of tool calls that started and have no result: run again if "
            "declared safe (declared, the default), report them interrupted (never), run again "
            "(always)",
        )

    def decisions(sub: argparse.ArgumentParser, *, reason_required: bool) -> None:
        lane_argument(sub)
        which = sub.add_mutually_exclusive_group(required=True)
        which.add_argument("--all", action="store_true", help="every pending call")
        which.add_argument(
            "--call",
            action="append",
            metavar="ID",
            help="a pending call's id (repeat --call ID for each: together they must be every "
            "pending call)",
        )
        sub.add_argument(
            "--reason", required=reason_required, help="why (recorded with the decision)"
        )
        acting(sub, confirm=True)

    command("sessions", reads.sessions, "list the sessions")
    lanes = command("lanes", reads.lanes, "list lanes with their status (all pages)")
    lanes.add_argument("--session", help="only this session's lanes")
    lanes.add_argument(
        "--status",
        metavar="S[,S]",
        help="only these statuses, comma-separated: idle, running, suspended, aborting, failed, "
        "stuck, faulted",
    )
    lanes.add_argument("--stuck", action="store_true", help="only stuck lanes")
    lane_argument(
        command("lane", reads.lane, "show one lane: status, pending approvals, interrupted calls")
    )
    timeline = command("timeline", reads.timeline, "a lane's log, oldest first")
    lane_argument(timeline)
    timeline.add_argument(
        "--limit", type=_positive_int, default=200, metavar="N", help="at most N items (200)"
    )
    lane_argument(command("usage", reads.usage, "a lane's cost ledger and its total"))
    command("backlog", reads.backlog, "what waits in the inbox and the outbox")
    mcp = command(
        "mcp",
        reads.mcp,
        "the MCP servers: state, trusted, tools, restarts, calls/failures, last error",
    )
    mcp.add_argument("--tools", action="store_true", help="also list each server's tools")
    deliveries = command("deliveries", reads.deliveries, "outbound messages of one status")
    deliveries.add_argument(
        "--status",
        choices=("dead", "pending", "delivered", "discarded"),
        default="dead",
        help="which (default: dead letters)",
    )
    deliveries.add_argument(
        "--limit", type=_positive_int, default=200, metavar="N", help="at most N (200)"
    )
    audit = command("audit", reads.audit, "the audit trail: who did what, when, with which outcome")
    audit.add_argument("--session", help="only this session")
    audit.add_argument("--lane", metavar="LANE", help="only this lane (its name or id)")
    audit.add_argument(
        "--limit", type=_positive_int, default=50, metavar="N", help="at most N events (50)"
    )
    action = command("action", reads.action, "where an action stands (after 'still running')")
    action.add_argument("action_id", metavar="ID", help="act_...")

    resume = command(
        "resume",
        actions.resume,
        "resume a lane suspended by a crash or a background request, or stuck",
    )
    lane_argument(resume)
    recovery(resume)
    acting(resume, confirm=True)
    unstick = command(
        "unstick",
        actions.resume,
        "resume a stuck lane with a fresh attempt budget (after fixing why)",
    )
    lane_argument(unstick)
    recovery(unstick)
    acting(unstick, confirm=True)
    abort = command("abort", actions.abort, "abort a lane's open operation")
    lane_argument(abort)
    acting(abort, confirm=True)
    rewind = command(
        "rewind", actions.rewind, "run a lane again from just before one of its messages"
    )
    lane_argument(rewind)
    rewind.add_argument("entry_id", metavar="ENTRY_ID", help="the user message (see timeline)")
    acting(rewind, confirm=True)
    retry = command("retry", actions.retry, "run a failed run again from its first message")
    lane_argument(retry)
    acting(retry, confirm=True)
    decisions(
        command("approve", actions.decide, "approve the tool calls a lane waits on"),
        reason_required=False,
    )
    decisions(
        command("deny", actions.decide, "deny the tool calls a lane waits on"), reason_required=True
    )
    supply = command(
        "supply",
        actions.decide,
        "answer the tool calls a lane waits on with their result: you did the action yourself, "
        "the tool does not run",
    )
    decisions(supply, reason_required=False)
    given = supply.add_mutually_exclusive_group(required=True)
    given.add_argument("--result", metavar="TEXT", help="the result the agent reads")
    given.add_argument(
        "--result-file", metavar="FILE", help="read the result from FILE (- for standard input)"
    )
    supply.add_argument(
        "--error", action="store_true", help="the action failed: the agent reads a failed call"
    )
    for name, handler, help_text in (
        (
            "revoke",
            actions.revoke,
            "withdraw a lane's authority, or a whole session's: its open runs end "
            "(authority_revoked), new messages are kept and not run, nothing more is posted",
        ),
        ("unrevoke", actions.unrevoke, "give a lane (or a session) its authority back"),
    ):
        sub = command(name, handler, help_text)
        sub.add_argument("session", metavar="SESSION", help="the session")
        sub.add_argument(
            "lane", metavar="LANE", nargs="?", help="one of its lanes (default: every lane)"
        )
        sub.add_argument("--reason", help="why (recorded, and shown to operators)")
        sub.add_argument(  # unrevoke asks nothing: taken all the same, as a script pairs them
            "-y",
            "--yes",
            action="store_true",
            help="do not ask (required without a terminal)"
            if name == "revoke"
            else "accepted, as revoke takes it (unrevoke asks nothing)",
        )
    budget = command(
        "budget",
        actions.budget,
        "set a lane's token budget over its profile's (to let a spent thread go on, or to hold "
        "one back); --reset gives it its profile's again",
    )
    lane_argument(budget)
    amount = budget.add_mutually_exclusive_group(required=True)
    amount.add_argument(
        "tokens",
        metavar="TOKENS",
        nargs="?",
        type=_tokens,
        help="what the lane may spend in all, what it spent included (see usage)",
    )
    amount.add_argument("--reset", action="store_true", help="its profile's budget again")
    budget.add_argument("--reason", help="why (recorded in the audit trail)")
    redeliver = command("redeliver", actions.redeliver, "send a dead letter again (fresh attempts)")
    redeliver.add_argument("delivery_id", metavar="DELIVERY_ID")
    acting(redeliver, confirm=False)
    discard = command("discard", actions.discard, "give up on a dead or pending delivery")
    discard.add_argument("delivery_id", metavar="DELIVERY_ID")
    acting(discard, confirm=True)
    return parser


def _tokens(text: str) -> int:
    """A budget on the command line: a whole number of tokens, 1 to 1,000,000,000."""
    cleaned = text.replace(",", "").replace("_", "")
    # ASCII digits only: str.isdigit() also takes "²" (which int() refuses) and "٣"
    tokens = whole_number(cleaned, MAX_BUDGET)
    if tokens is None or tokens < 1:
        raise argparse.ArgumentTypeError(
            f"expected a number of tokens from 1 to {MAX_BUDGET:,}, not {text!r}"
        )
    return tokens
