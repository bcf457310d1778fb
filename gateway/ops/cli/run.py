"""One command's run: its arguments and client, what it prints, the lane it names, confirming."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from gateway.invocation import command as typed_command
from gateway.ops.cli.client import Client
from gateway.ops.cli.errors import OK, USAGE, OpsError
from gateway.ops.cli.output import Json, clean, seg, table_lines

__all__ = ["Handler", "Run"]

WAITING_NOTICE_S = 2.0
"""How long an action's answer may take before a terminal is told what it waits for."""


class Run:
    """One command: its arguments, the client and the output."""

    def __init__(self, args: argparse.Namespace, client: Client) -> None:
        self.args = args
        self.client = client
        self.key_sent: str | None = None
        """The Idempotency-Key of an action on its way (what a Ctrl-C then says to reuse)."""

    def say(self, *lines: str) -> None:
        """Lines for stdout (clipped to a terminal's width)."""
        out = sys.stdout
        width = shutil.get_terminal_size().columns if out.isatty() else 0
        for line in lines:
            if width and len(line) > width:
                line = line[: width - 1] + "…"
            out.write(line + "\n")

    def note(self, *lines: str) -> None:
        """Lines for stderr (what people read beside the result)."""
        for line in lines:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def json(self, value: Any) -> None:
        """The API's JSON."""
        sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=False) + "\n")

    def table(self, headers: Sequence[str], rows: Iterable[Sequence[Any]], empty: str) -> None:
        """Rows under their headers on stdout, or `empty` on stderr when there are none."""
        lines = table_lines(headers, rows)
        if lines:
            self.say(*lines)
        else:
            self.note(empty)

    @property
    def wants_json(self) -> bool:
        """Whether ``--json`` asked for the API's JSON instead of text."""
        return bool(self.args.json)

    # -- lanes ---------------------------------------------------------------------------------

    def lane(self, ref: str) -> Json:
        """The lane a LANE argument names: an id, a name, or SESSION/LANE."""
        ref = ref.strip()
        if ref.startswith("ln_"):
            view: Json = self.client.get(f"/lanes/{seg(ref)}")
            return view
        found: list[Json] = []
        session, sep, name = ref.partition("/")
        if sep and session and name:
            listed = self.client.pages("/lanes", {"session": session, "lane": name})["items"]
            found = [v for v in listed if v.get("lane") == name]
        if not found:
            listed = self.client.pages("/lanes", {"lane": ref})["items"]
            found = [v for v in listed if v.get("lane") == ref]
        if not found:
            raise OpsError(
                f"no lane {clean(ref)!r} ({typed_command()} ops lanes lists them; a lane is named "
                "by its id, its name like web:hello, or SESSION/LANE)"
            )
        if len(found) > 1:
            sessions = ", ".join(sorted(str(v.get("session")) for v in found))
            raise OpsError(
                f"lane {clean(ref)!r} is in {len(found)} sessions ({clean(sessions)}): name "
                f"one as SESSION/LANE, like {clean(str(found[0].get('session')))}/{clean(ref)}",
                USAGE,
            )
        return found[0]

    def confirm(self, allowed: bool, lines: Sequence[str], what: str) -> None:
        """Say what an action will do and ask (a terminal) or require --yes (no terminal)."""
        if not allowed:
            return  # the gateway refuses it and says why: nothing to confirm
        if getattr(self.args, "yes", False):
            self.note(*lines)
            return
        stdin = sys.stdin
        if stdin is None or not _isatty(stdin):
            raise OpsError(
                f"{what} needs confirmation: pass --yes (stdin is not a terminal to ask on)",
                USAGE,
            )
        self.note(*lines)
        sys.stderr.write("Proceed? [y/N] ")
        sys.stderr.flush()
        answer = stdin.readline()
        if answer.strip().lower() not in ("y", "yes"):
            raise OpsError("not confirmed: nothing was done")

    def act(self, verb: str, view: Json, path: str, body: Any = None) -> int:
        """POST an action on a lane; one line: its result, or where to check on it."""
        timeout = self.client.timeout
        wait = min(25.0, timeout - 5.0) if timeout > 10 else timeout / 2
        # the gateway answers when the lane's worker is through, up to `wait` seconds: a person
        # at a terminal is told so, instead of a silence that reads as a hang
        waiting = f"(waiting for the worker holding {clean(view.get('lane'))} to carry it out: "
        notice = threading.Timer(
            WAITING_NOTICE_S,
            self.note,
            args=(f"{waiting}up to {max(wait - WAITING_NOTICE_S, 0):.0f} s more)",),
        )
        notice.daemon = True
        if _isatty(sys.stderr):
            notice.start()
        try:
            status, result = self.client.request(
                "POST",
                f"/lanes/{seg(str(view['id']))}/{path}",
                params={"wait": f"{wait:.1f}"},
                body=body,
                key=self.key(),
            )
        finally:
            notice.cancel()
        return self.said(verb, view, status, result)

    def earlier(self) -> Json | None:
        """The action this invocation's ``--idempotency-key`` already named (None: none)."""
        given: str | None = getattr(self.args, "idempotency_key", None)
        if not given:
            return None
        try:
            _, found = self.client.request("GET", "/actions", params={"key": given})
        except OpsError as exc:
            if exc.code == "not_found":  # nothing was done under it
                return None
            raise
        return found if isinstance(found, dict) else None

    def said(self, verb: str, view: Json, status: int, result: Json) -> int:
        """One line for an action's result (or where to check on it); `--json` prints it."""
        if self.wants_json:
            self.json(result)
            return OK
        name = clean(view.get("lane"))
        action = clean(result.get("id"))
        if status == 202 or result.get("status") in ("pending", "running"):
            command = self.args.command
            self.say(
                f"{command} {name}: still running; check with: {typed_command()} ops action "
                f"{action}"
            )
        else:
            outcome = clean(result.get("outcome") or result.get("status") or "done")
            self.say(f"{verb} {name}: {outcome} (action {action})")
        return OK

    def key(self) -> str:
        """This invocation's Idempotency-Key (the same one retries the same action)."""
        given: str | None = getattr(self.args, "idempotency_key", None)
        self.key_sent = self.key_sent or given or f"cli-{uuid.uuid4()}"
        return self.key_sent


Handler = Callable[[Run], int]
"""A command: what it does with one run; returns the exit status."""


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False
