"""``gateway ops``: the operator API (``/api/v1``) from the terminal.

Reads (``sessions``, ``lanes``, ``lane``, ``timeline``, ``usage``, ``backlog``, ``deliveries``,
``audit``, ``action``) print tables for people or, with ``--json``, the API's JSON; actions
(``resume``, ``unstick``, ``abort``, ``rewind``, ``retry``, ``approve``, ``deny``, ``redeliver``,
``discard``) print one line each. A lane is named by its id (``ln_...``), its name
(``web:hello``, ``slack:C1:123.4``) or ``SESSION/LANE``.

Where and as whom: ``--url`` (else ``GATEWAY_OPS_URL``, else the address in the settings
``gateway serve`` reads) and ``--token`` (else ``GATEWAY_OPS_TOKEN``, else the token the
embedded service keeps beside its store). Actions that change a lane say what they will do and
ask first; without a terminal they need ``--yes``. Every action carries an ``Idempotency-Key``
(``--idempotency-key`` to retry one safely).

Exit status: 0 done, 1 the gateway refused or failed, 2 a usage error (or a confirmation that
was needed), 3 the gateway could not be reached, 130 interrupted. Errors are one line on stderr.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import sys
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from config import Settings, SettingsError, format_settings_error, load_settings
from gateway.errors import GatewayError
from gateway.invocation import command as typed_command

__all__ = ["main"]

API = "/api/v1"
OK, FAILED, USAGE, UNREACHABLE, INTERRUPTED = 0, 1, 2, 3, 130
URL_VARIABLE = "GATEWAY_OPS_URL"
TOKEN_VARIABLE = "GATEWAY_OPS_TOKEN"
_CLIENT_VARIABLES = frozenset({URL_VARIABLE, TOKEN_VARIABLE})
_WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1", "": "127.0.0.1"}
_PAGE = 100
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069]")
_ERRNO = re.compile(r"^\[Errno -?\d+\]\s*")

Json = dict[str, Any]
Handler = Callable[["_Run"], int]


class OpsError(GatewayError):
    """A failure reported as one line on stderr, with the exit status."""

    def __init__(self, message: str, status: int = FAILED) -> None:
        super().__init__(message)
        self.message = message
        self.status = status

    @property
    def exit_status(self) -> int:
        """This error's own `status`."""
        return self.status


# -- where the gateway is and who we are ----------------------------------------------------


class _Target:
    """The gateway's URL and the token, from the flags, the environment or the settings."""

    def __init__(self, args: argparse.Namespace, settings: Settings | None) -> None:
        self._args = args
        self._settings = settings
        self._settings_error: str | None = None
        self.url = self._url()
        self.token, self.token_source = self._token()

    def settings(self) -> Settings:
        """The settings `gateway serve` reads (the client's own variables left out)."""
        if self._settings_error is not None:
            raise OpsError(self._settings_error, USAGE)
        if self._settings is None:
            # GATEWAY_OPS_URL / GATEWAY_OPS_TOKEN are this client's, not settings: the loader
            # would call them unknown
            environ = {k: v for k, v in os.environ.items() if k.upper() not in _CLIENT_VARIABLES}
            dotenv = Path(".env")
            try:
                self._settings = load_settings(
                    environ,
                    config_file=self._args.config,
                    env_file=dotenv if dotenv.is_file() else None,
                )
            except SettingsError as exc:
                self._settings_error = (
                    f"cannot read the settings ({format_settings_error(exc)}); "
                    "pass --url and --token to do without them"
                )
                raise OpsError(self._settings_error, USAGE) from None
        return self._settings

    def token_file(self) -> Path | None:
        """Where the embedded service keeps its operator token (None: no such file)."""
        from gateway.ops.auth import token_file

        try:
            path = token_file(self.settings().effective_store_url)
        except OpsError:
            return None
        return path.absolute() if path is not None else None

    def _url(self) -> str:
        given = self._args.url or os.environ.get(URL_VARIABLE, "").strip()
        if given:
            source = "--url" if self._args.url else URL_VARIABLE
        else:
            settings = self.settings()
            host = _WILDCARDS.get(settings.host, settings.host)
            if ":" in host and not host.startswith("["):
                host = f"[{host}]"
            given, source = f"http://{host}:{settings.port}", "the settings"
        url = given.strip().rstrip("/")
        url = url.removesuffix(API).rstrip("/")
        try:
            parsed = httpx.URL(url)
        except (httpx.InvalidURL, TypeError):
            parsed = None
        if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
            raise OpsError(
                f"{source} must be the gateway's address like http://127.0.0.1:8787, "
                f"not {_clean(given)!r}",
                USAGE,
            )
        return url

    def _token(self) -> tuple[str | None, str]:
        token, source = self._found_token()
        if token is not None and not re.fullmatch(r"[!-~]+", token):
            raise OpsError(f"the token from {source} is not one line of visible ASCII", USAGE)
        return token, source

    def _found_token(self) -> tuple[str | None, str]:
        if self._args.token:
            return self._args.token.strip(), "--token"
        from_env = os.environ.get(TOKEN_VARIABLE, "").strip()
        if from_env:
            return from_env, TOKEN_VARIABLE
        path = self.token_file()
        if path is not None:
            try:
                text = path.read_text(encoding="ascii").strip()
            except (OSError, UnicodeDecodeError):
                text = ""
            if text:
                return text, f"the token file {path}"
        return None, ""


# -- the HTTP client -------------------------------------------------------------------------


class _Client:
    """The operator API over HTTP; every failure becomes an `OpsError`."""

    def __init__(self, target: _Target, timeout: float) -> None:
        self.target = target
        self.url = target.url
        self.timeout = timeout
        headers = {"Accept": "application/json", "User-Agent": "gateway-ops"}
        if target.token:
            headers["Authorization"] = f"Bearer {target.token}"
        self._http = httpx.Client(base_url=self.url + API, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        return self.request("GET", path, params=params)[1]

    def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        body: Any = None,
        key: str | None = None,
    ) -> tuple[int, Any]:
        headers = {"Idempotency-Key": key} if key else None
        try:
            response = self._http.request(
                method,
                path,
                params={k: v for k, v in (params or {}).items() if v is not None},
                json=body,
                headers=headers,
            )
        except httpx.TimeoutException:
            raise self._unreachable(f"no answer within {self.timeout:g} s") from None
        except httpx.TransportError as exc:
            reason = _ERRNO.sub("", str(exc)).strip() or type(exc).__name__
            raise self._unreachable(reason) from None
        return self._judge(response)

    def pages(
        self, path: str, params: dict[str, Any], *, limit: int | None = None, size: int = _PAGE
    ) -> Json:
        """Every page's items (up to `limit`), as one page: the first page's other fields kept."""
        merged: Json = {}
        items: list[Any] = []
        cursor: str | None = None
        seen: set[str] = set()
        while True:
            want = size if limit is None else min(size, limit - len(items))
            page = self.get(path, {**params, "limit": want, "cursor": cursor})
            if not isinstance(page, dict) or not isinstance(page.get("items"), list):
                raise OpsError(f"unexpected answer from {self.url}: not a page of items")
            merged = merged or dict(page)
            items.extend(page["items"])
            cursor = page.get("next_cursor") or None
            if cursor is None or cursor in seen or (limit is not None and len(items) >= limit):
                break
            seen.add(cursor)
        merged.update(items=items, next_cursor=cursor)
        return merged

    def _unreachable(self, reason: str) -> OpsError:
        return OpsError(
            f"cannot reach the gateway at {self.url} ({_clean(reason)}): is gateway serve running?",
            UNREACHABLE,
        )

    def _judge(self, response: httpx.Response) -> tuple[int, Any]:
        status = response.status_code
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.is_success:
            if body is None:
                raise OpsError(
                    f"unexpected answer from {self.url}: HTTP {status} without JSON "
                    "(is that the gateway's address?)"
                )
            return status, body
        error = body.get("error") if isinstance(body, dict) else None
        if not isinstance(error, dict):
            raise OpsError(
                f"unexpected answer from {self.url}: HTTP {status} (is that the gateway's address?)"
            )
        code = str(error.get("code") or status)
        message = str(error.get("message") or "refused")
        details = error.get("details")
        details = details if isinstance(details, dict) else {}
        if status == 401:
            raise OpsError(self._unauthenticated(message))
        extra = _detail(details)
        line = f"{message} ({code}{', ' + extra if extra else ''})"
        if status == 403 and "operator" not in message:
            line += ": this needs an operator token"
        raise OpsError(_clean(line))

    def _unauthenticated(self, message: str) -> str:
        target = self.target
        how = f"pass an operator or viewer token with --token TOKEN or {TOKEN_VARIABLE}"
        path = target.token_file()
        if target.token is None:
            local = f" (a local gateway without ops_tokens keeps one in {path})" if path else ""
            return f"no token was given (unauthenticated): {how}{local}"
        if target.token_source.startswith("the token file"):
            how += " (that file belongs to another gateway, or an older start of this one)"
        elif path is not None:
            how += f", or leave both unset to use the local gateway's token in {path}"
        return _clean(
            f"the token from {target.token_source} was refused: {message} (unauthenticated): {how}"
        )


def _detail(details: dict[str, Any]) -> str:
    reason = details.get("reason")
    if reason:
        return str(reason)
    fields = details.get("fields")
    if isinstance(fields, list) and fields:
        return "; ".join(
            f"{item.get('field')}: {item.get('reason')}"
            for item in fields[:3]
            if isinstance(item, dict)
        )
    return ""


# -- one run ---------------------------------------------------------------------------------


class _Run:
    """One command: its arguments, the client and the output."""

    def __init__(self, args: argparse.Namespace, client: _Client) -> None:
        self.args = args
        self.client = client

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

    @property
    def wants_json(self) -> bool:
        return bool(self.args.json)

    # -- lanes ---------------------------------------------------------------------------------

    def lane(self, ref: str) -> Json:
        """The lane a LANE argument names: an id, a name, or SESSION/LANE."""
        ref = ref.strip()
        if ref.startswith("ln_"):
            view: Json = self.client.get(f"/lanes/{_seg(ref)}")
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
                f"no lane {_clean(ref)!r} ({typed_command()} ops lanes lists them; a lane is named "
                "by its id, its name like web:hello, or SESSION/LANE)"
            )
        if len(found) > 1:
            sessions = ", ".join(sorted(str(v.get("session")) for v in found))
            raise OpsError(
                f"lane {_clean(ref)!r} is in {len(found)} sessions ({_clean(sessions)}): name "
                f"one as SESSION/LANE, like {_clean(str(found[0].get('session')))}/{_clean(ref)}",
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
        status, result = self.client.request(
            "POST",
            f"/lanes/{_seg(str(view['id']))}/{path}",
            params={"wait": f"{wait:.1f}"},
            body=body,
            key=self.key(),
        )
        if self.wants_json:
            self.json(result)
            return OK
        name = _clean(view.get("lane"))
        action = _clean(result.get("id"))
        if status == 202 or result.get("status") in ("pending", "running"):
            command = self.args.command
            self.say(f"{command} {name}: still running; check with: gateway ops action {action}")
        else:
            outcome = _clean(result.get("outcome") or result.get("status") or "done")
            self.say(f"{verb} {name}: {outcome} (action {action})")
        return OK

    def key(self) -> str:
        """This invocation's Idempotency-Key (the same one retries the same action)."""
        given: str | None = getattr(self.args, "idempotency_key", None)
        return given or f"cli-{uuid.uuid4()}"


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


# -- reads -----------------------------------------------------------------------------------


def _sessions(run: _Run) -> int:
    page = run.client.pages("/sessions", {})
    if run.wants_json:
        run.json(page)
        return OK
    rows = [
        [
            s.get("id"),
            s.get("name") or "",
            s.get("lanes"),
            s.get("held_by") or "-",
            _when(s.get("created_at_ms")),
        ]
        for s in page["items"]
    ]
    _table(run, ["SESSION", "NAME", "LANES", "HELD BY", "CREATED (UTC)"], rows, "no sessions")
    return OK


def _lanes(run: _Run) -> int:
    args = run.args
    params = {
        "session": args.session,
        "status": args.status,
        "stuck": "true" if args.stuck else None,
    }
    page = run.client.pages("/lanes", params)
    if run.wants_json:
        run.json(page)
        return OK
    rows = [
        [
            v.get("session"),
            v.get("lane"),
            v.get("status"),
            _clip(_why(v), 40),
            _attempts(v),
            _clip(v.get("activity") or "", 60),
        ]
        for v in page["items"]
    ]
    headers = ["SESSION", "LANE", "STATUS", "WHY", "ATTEMPTS", "ACTIVITY"]
    _table(run, headers, rows, "no lanes match")
    return OK


def _lane(run: _Run) -> int:
    view = run.lane(run.args.lane)
    if run.wants_json:
        run.json(view)
        return OK
    status = str(view.get("status"))
    if view.get("suspended"):
        status += f" ({view['suspended']})"
    error = view.get("error") or {}
    thread = view.get("thread") or {}
    fields = [
        ("lane", view.get("lane")),
        ("session", view.get("session")),
        ("id", view.get("id")),
        ("status", status),
        ("attempts", _attempts(view) or None),
        ("activity", view.get("activity")),
        ("last outcome", view.get("last_outcome")),
        ("error", f"{error.get('code')}: {error.get('message')}" if error else None),
        ("fault", view.get("fault")),
        ("queued", view.get("queued") or None),
        (
            "thread",
            " ".join(str(thread.get(k)) for k in ("channel", "space", "thread") if thread.get(k))
            or None,
        ),
        ("held by", view.get("held_by")),
        ("actions", ", ".join(view.get("actions") or []) or "none"),
    ]
    width = max(len(name) for name, _ in fields)
    run.say(*(f"{name:<{width}}  {_clean(value)}" for name, value in fields if value is not None))
    pending = view.get("pending_approvals") or []
    if pending:
        run.say(f"pending approvals (wait {_clean(view.get('wait_id'))}):")
        run.say(*(f"  {_call(call)}" for call in pending))
    interrupted = view.get("interrupted_calls") or []
    if interrupted:
        run.say("interrupted tool calls (what a resume does, by --tool-recovery):")
        for call in interrupted:
            run.say(
                f"  {_clean(call.get('tool_call_id'))}  {_clean(call.get('tool_name'))} "
                f"(started replay={_clean(call.get('replay'))})"
            )
            for policy, effect in (call.get("on_resume") or {}).items():
                run.say(f"    {_clean(policy)}: {_clean(effect)}")
    return OK


def _timeline(run: _Run) -> int:
    view = run.lane(run.args.lane)
    page = run.client.pages(
        f"/lanes/{_seg(str(view['id']))}/timeline", {}, limit=run.args.limit, size=500
    )
    if run.wants_json:
        run.json(page)
        return OK
    more = bool(page.get("next_cursor"))
    rows = _with_audit(page["items"], page.get("audit") or [], complete=not more)
    _table(run, ["SEQ", "TIME", "TYPE", "SUMMARY"], rows, "the lane's log is empty")
    if more:
        run.note(f"(stopped at {len(page['items'])} items; there may be more: --limit N)")
    return OK


def _with_audit(items: list[Any], audit: list[Any], *, complete: bool) -> list[list[Any]]:
    """The log's rows in their order, each audit event before the first entry newer than it.

    The log keeps its own order (a takeover by a machine whose clock differs must not reorder
    it); audit rows have no seq and say who did what: ``stop requested by web:U1: stopped``.
    Events newer than the last item follow it only when the log is `complete` (not cut short).
    """
    events = sorted(
        (e for e in audit if isinstance(e, dict)), key=lambda e: (e.get("at_ms") or 0, e.get("id"))
    )
    rows: list[list[Any]] = []
    for item in items:
        while events and (events[0].get("at_ms") or 0) < (item.get("at_ms") or 0):
            rows.append(_audit_row(events.pop(0)))
        rows.append(
            [item.get("seq"), _time(item.get("at_ms")), item.get("type"), item.get("summary")]
        )
    if complete:
        rows.extend(_audit_row(e) for e in events)
    return rows


def _audit_row(event: dict[str, Any]) -> list[Any]:
    said = f"{event.get('action')} by {event.get('actor')}: {event.get('outcome')}"
    return ["-", _time(event.get("at_ms")), "audit", said]


def _usage(run: _Run) -> int:
    view = run.lane(run.args.lane)
    page = run.client.pages(f"/lanes/{_seg(str(view['id']))}/usage", {})
    if run.wants_json:
        run.json(page)
        return OK
    rows = []
    for item in page["items"]:
        usage = item.get("usage") or {}
        rows.append(
            [
                item.get("seq"),
                _time(item.get("at_ms")),
                item.get("cause"),
                item.get("attempt") or "",
                item.get("stop_reason") or "",
                usage.get("input"),
                usage.get("output"),
                _cost(usage),
            ]
        )
    headers = ["SEQ", "TIME", "CAUSE", "ATTEMPT", "STOP", "IN", "OUT", "COST"]
    _table(run, headers, rows, "no usage recorded")
    total = page.get("total") or {}
    run.say(
        f"total: {total.get('input', 0)} in / {total.get('output', 0)} out, "
        f"{total.get('total_tokens', 0)} tokens, cost {_cost(total)}"
    )
    return OK


def _backlog(run: _Run) -> int:
    view = run.client.get("/backlog")
    if run.wants_json:
        run.json(view)
        return OK
    run.say(
        f"inbox:  {view.get('inbox_pending')} pending "
        f"(oldest {_age(view.get('inbox_oldest_age_ms'))}), {view.get('inbox_rejected')} rejected",
        f"outbox: {view.get('outbox_pending')} pending "
        f"(oldest {_age(view.get('outbox_oldest_age_ms'))}), "
        f"{view.get('dead_letters')} dead letters",
    )
    return OK


def _deliveries(run: _Run) -> int:
    page = run.client.pages("/deliveries", {"status": run.args.status}, limit=run.args.limit)
    if run.wants_json:
        run.json(page)
        return OK
    rows = [
        [
            d.get("id"),
            f"{d.get('session')}/{d.get('lane')}",
            d.get("status"),
            d.get("attempts"),
            _clip(d.get("last_error") or "", 40),
            _clip(d.get("text") or d.get("kind") or "", 60),
        ]
        for d in page["items"]
    ]
    headers = ["ID", "LANE", "STATUS", "ATTEMPTS", "ERROR", "TEXT"]
    _table(run, headers, rows, f"no {run.args.status} deliveries")
    return OK


def _audit(run: _Run) -> int:
    args = run.args
    lane = args.lane
    session = args.session
    if lane and lane.startswith("ln_"):
        view = run.lane(lane)
        lane, session = view.get("lane"), session or view.get("session")
    page = run.client.pages(
        "/audit", {"session": session, "lane": lane}, limit=args.limit, size=min(args.limit, _PAGE)
    )
    if run.wants_json:
        run.json(page)
        return OK
    rows = [
        [
            _when(e.get("at_ms")),
            e.get("actor"),
            e.get("action"),
            f"{e.get('session') or '-'}/{e.get('lane') or '-'}",
            _clip(e.get("target") or "", 40),
            e.get("outcome"),
        ]
        for e in page["items"]
    ]
    headers = ["TIME (UTC)", "ACTOR", "ACTION", "LANE", "TARGET", "OUTCOME"]
    _table(run, headers, rows, "no audit events")
    return OK


def _action(run: _Run) -> int:
    result = run.client.get(f"/actions/{_seg(run.args.action_id)}")
    if run.wants_json:
        run.json(result)
        return OK
    state = _clean(result.get("status"))
    if result.get("outcome"):
        state += f", {_clean(result.get('outcome'))}"
    run.say(
        f"{_clean(result.get('id'))}: {_clean(result.get('kind'))} "
        f"{_clean(result.get('session'))}/{_clean(result.get('lane'))}: {state}"
    )
    return OK


# -- actions ---------------------------------------------------------------------------------


def _resume(run: _Run) -> int:
    command = run.args.command
    view = run.lane(run.args.lane)
    policy = run.args.tool_recovery
    lines = [_state_line(view)]
    if command == "unstick" or view.get("status") == "stuck":
        lines.append(f"{command} starts a fresh attempt budget")
    calls = view.get("interrupted_calls") or []
    if calls:
        lines.append(
            f"with --tool-recovery {policy}, the tool calls that started and have no result:"
        )
        for call in calls:
            effect = (call.get("on_resume") or {}).get(policy, "?")
            lines.append(
                f"  {_clean(call.get('tool_name'))} {_clean(call.get('tool_call_id'))} "
                f"(started replay={_clean(call.get('replay'))}): {_clean(effect)}"
            )
    else:
        lines.append("no tool call is left without a result")
    run.confirm(command in (view.get("actions") or []), lines, command)
    verb = "resumed" if command == "resume" else "unstuck"
    return run.act(verb, view, command, {"tool_recovery": policy})


def _abort(run: _Run) -> int:
    view = run.lane(run.args.lane)
    lines = [
        _state_line(view),
        "abort ends its open operation (what it did so far stays in the log)",
    ]
    run.confirm("abort" in (view.get("actions") or []), lines, "abort")
    return run.act("aborted", view, "abort")


def _rewind(run: _Run) -> int:
    view = run.lane(run.args.lane)
    entry = run.args.entry_id
    lines = [
        _state_line(view),
        f"rewind moves it to just before message {_clean(entry)} and runs it again "
        "(the current branch stays in the log)",
    ]
    run.confirm("rewind" in (view.get("actions") or []), lines, "rewind")
    return run.act("rewound", view, "rewind", {"entry_id": entry})


def _retry(run: _Run) -> int:
    view = run.lane(run.args.lane)
    lines = [
        _state_line(view),
        "retry runs the failed run again from its first message (the failed branch stays)",
    ]
    run.confirm("retry" in (view.get("actions") or []), lines, "retry")
    return run.act("retried", view, "retry")


def _decide(run: _Run) -> int:
    args = run.args
    approve = args.command == "approve"
    view = run.lane(args.lane)
    name = _clean(view.get("lane"))
    pending = view.get("pending_approvals") or []
    wait_id = view.get("wait_id")
    if view.get("status") != "suspended" or view.get("suspended") != "approval" or not pending:
        status = _clean(view.get("status"))
        if view.get("suspended"):
            status += f" ({_clean(view.get('suspended'))})"
        raise OpsError(f"{name} waits on no approval: it is {status}")
    ids = [str(call.get("tool_call_id")) for call in pending]
    if args.all:
        chosen = ids
    else:
        chosen = list(dict.fromkeys(args.call))
        unknown = [c for c in chosen if c not in ids]
        missing = [c for c in ids if c not in chosen]
        if unknown or missing:
            listed = ", ".join(_call(call) for call in pending)
            problems = []
            if unknown:
                problems.append(f"not pending: {', '.join(map(_clean, unknown))}")
            if missing:
                problems.append(f"not named: {', '.join(map(_clean, missing))}")
            raise OpsError(
                f"{'; '.join(problems)}. {name} waits on {len(ids)} "
                f"call{'s' if len(ids) > 1 else ''}: {listed}. One decision covers every pending "
                f"call: name them all with --call, or use --all (nothing was sent)"
            )
    choice: Json = {"action": "approve" if approve else "deny"}
    if args.reason is not None:
        choice["reason"] = args.reason
    body = {"wait_id": wait_id, "approvals": {call_id: dict(choice) for call_id in chosen}}
    return run.act("approved" if approve else "denied", view, "decisions", body)


def _redeliver(run: _Run) -> int:
    return _delivery_action(run, "redeliver", "redelivered")


def _discard(run: _Run) -> int:
    delivery = run.args.delivery_id
    lines = [f"discard gives up on delivery {_clean(delivery)}: it will not be sent"]
    run.confirm(True, lines, "discard")
    return _delivery_action(run, "discard", "discarded")


def _delivery_action(run: _Run, path: str, verb: str) -> int:
    delivery = run.args.delivery_id
    _, view = run.client.request("POST", f"/deliveries/{_seg(delivery)}/{path}", key=run.key())
    if run.wants_json:
        run.json(view)
        return OK
    run.say(
        f"{verb} {_clean(view.get('id'))} ({_clean(view.get('session'))}/"
        f"{_clean(view.get('lane'))}): {_clean(view.get('status'))}"
    )
    return OK


# -- formatting ------------------------------------------------------------------------------


def _clean(value: Any) -> str:
    """`value` as text safe for one terminal line (control characters shown, not obeyed)."""
    text = "" if value is None else str(value)

    def shown(match: re.Match[str]) -> str:
        char = match.group()
        if char == "\n":
            return "\\n"
        if char == "\t":
            return " "
        return f"\\u{ord(char):04x}" if ord(char) > 0xFF else f"\\x{ord(char):02x}"

    return _CONTROL.sub(shown, text)


def _clip(text: str, size: int) -> str:
    return text if len(text) <= size else text[: size - 1] + "…"


def _table(run: _Run, headers: Sequence[str], rows: Iterable[Sequence[Any]], empty: str) -> None:
    cells = [[_clean(cell) for cell in row] for row in rows]
    if not cells:
        run.note(empty)
        return
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]

    def line(row: Sequence[str]) -> str:
        return "  ".join(
            cell.ljust(width) for cell, width in zip(row, widths, strict=True)
        ).rstrip()

    run.say(line(headers), *(line(row) for row in cells))


def _why(view: Json) -> str:
    status = view.get("status")
    error = view.get("error") or {}
    if status == "faulted":
        return str(view.get("fault") or "")
    if status == "failed" and error:
        return f"{error.get('code')}: {error.get('message')}"
    if view.get("suspended"):
        return str(view["suspended"])
    if view.get("pending_approvals"):
        return "approval"
    if status == "idle" and view.get("last_outcome"):
        return f"last: {view['last_outcome']}"
    return ""


def _attempts(view: Json) -> str:
    attempts = view.get("attempts") or 0
    return f"{attempts}/{view.get('max_attempts')}" if attempts else ""


def _state_line(view: Json) -> str:
    status = _clean(view.get("status"))
    if view.get("suspended"):
        status += f" ({_clean(view.get('suspended'))})"
    parts = [f"{_clean(view.get('session'))}/{_clean(view.get('lane'))} is {status}"]
    if view.get("attempts"):
        parts.append(f"attempt {view.get('attempts')} of {view.get('max_attempts')}")
    if view.get("activity"):
        parts.append(f"last doing: {_clean(view.get('activity'))}")
    error = view.get("error")
    if error:
        parts.append(f"error: {_clean(error.get('code'))}: {_clean(error.get('message'))}")
    return ", ".join(parts)


def _call(call: Json) -> str:
    arguments = json.dumps(call.get("arguments", {}), ensure_ascii=False, separators=(",", ":"))
    return _clean(f"{call.get('tool_call_id')} {call.get('tool_name')}({_clip(arguments, 80)})")


def _time(ms: Any) -> str:
    stamp = _stamp(ms)
    return stamp.strftime("%H:%M:%S") if stamp else "?"


def _when(ms: Any) -> str:
    stamp = _stamp(ms)
    return stamp.strftime("%Y-%m-%d %H:%M:%S") if stamp else "?"


def _stamp(ms: Any) -> datetime.datetime | None:
    try:
        return datetime.datetime.fromtimestamp(int(ms) / 1000, tz=datetime.UTC)
    except (TypeError, ValueError, OverflowError, OSError):
        return None


def _age(ms: Any) -> str:
    seconds = int(ms or 0) // 1000
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"


def _cost(usage: Json) -> str:
    cost = usage.get("cost") or {}
    total = cost.get("total") if isinstance(cost, dict) else None
    return f"{float(total):.4f}" if isinstance(total, int | float) else ""


def _seg(value: str) -> str:
    """A path segment (ids are opaque: nothing in them may change the path)."""
    return quote(value, safe="")


# -- the command line ------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return value


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


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    _global_options(common, defaults=False)
    parser = argparse.ArgumentParser(
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
        if confirm:
            sub.add_argument(
                "-y", "--yes", action="store_true", help="do not ask (required without a terminal)"
            )
        sub.add_argument(
            "--idempotency-key",
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
        acting(sub, confirm=False)

    command("sessions", _sessions, "list the sessions")
    lanes = command("lanes", _lanes, "list lanes with their status (all pages)")
    lanes.add_argument("--session", help="only this session's lanes")
    lanes.add_argument(
        "--status",
        metavar="S[,S]",
        help="only these statuses, comma-separated: idle, running, suspended, aborting, failed, "
        "stuck, faulted",
    )
    lanes.add_argument("--stuck", action="store_true", help="only stuck lanes")
    lane_argument(
        command("lane", _lane, "show one lane: status, pending approvals, interrupted calls")
    )
    timeline = command("timeline", _timeline, "a lane's log, oldest first")
    lane_argument(timeline)
    timeline.add_argument(
        "--limit", type=_positive_int, default=200, metavar="N", help="at most N items (200)"
    )
    lane_argument(command("usage", _usage, "a lane's cost ledger and its total"))
    command("backlog", _backlog, "what waits in the inbox and the outbox")
    deliveries = command("deliveries", _deliveries, "outbound messages of one status")
    deliveries.add_argument(
        "--status",
        choices=("dead", "pending", "delivered", "discarded"),
        default="dead",
        help="which (default: dead letters)",
    )
    deliveries.add_argument(
        "--limit", type=_positive_int, default=200, metavar="N", help="at most N (200)"
    )
    audit = command("audit", _audit, "the audit trail: who did what, when, with which outcome")
    audit.add_argument("--session", help="only this session")
    audit.add_argument("--lane", metavar="LANE", help="only this lane (its name or id)")
    audit.add_argument(
        "--limit", type=_positive_int, default=50, metavar="N", help="at most N events (50)"
    )
    action = command("action", _action, "where an action stands (after 'still running')")
    action.add_argument("action_id", metavar="ID", help="act_...")

    resume = command(
        "resume", _resume, "resume a lane suspended by a crash or a background request, or stuck"
    )
    lane_argument(resume)
    recovery(resume)
    acting(resume, confirm=True)
    unstick = command(
        "unstick", _resume, "resume a stuck lane with a fresh attempt budget (after fixing why)"
    )
    lane_argument(unstick)
    recovery(unstick)
    acting(unstick, confirm=True)
    abort = command("abort", _abort, "abort a lane's open operation")
    lane_argument(abort)
    acting(abort, confirm=True)
    rewind = command("rewind", _rewind, "run a lane again from just before one of its messages")
    lane_argument(rewind)
    rewind.add_argument("entry_id", metavar="ENTRY_ID", help="the user message (see timeline)")
    acting(rewind, confirm=True)
    retry = command("retry", _retry, "run a failed run again from its first message")
    lane_argument(retry)
    acting(retry, confirm=True)
    decisions(
        command("approve", _decide, "approve the tool calls a lane waits on"), reason_required=False
    )
    decisions(command("deny", _decide, "deny the tool calls a lane waits on"), reason_required=True)
    redeliver = command("redeliver", _redeliver, "send a dead letter again (fresh attempts)")
    redeliver.add_argument("delivery_id", metavar="DELIVERY_ID")
    acting(redeliver, confirm=False)
    discard = command("discard", _discard, "give up on a dead or pending delivery")
    discard.add_argument("delivery_id", metavar="DELIVERY_ID")
    acting(discard, confirm=True)
    return parser


def main(argv: Sequence[str], settings: Settings | None = None) -> int:
    """Run ``gateway ops ARGV``; returns the exit status (`settings`: None loads them)."""
    try:
        try:
            args = _parser().parse_args(list(argv))
        except SystemExit as exc:  # --help (0) or a usage error (2), already printed
            return exc.code if isinstance(exc.code, int) else USAGE
        client: _Client | None = None
        try:
            client = _Client(_Target(args, settings), args.timeout)
            handler: Handler = args.handler
            status = handler(_Run(args, client))
        finally:
            if client is not None:
                client.close()
        sys.stdout.flush()
        return status
    except OpsError as exc:
        _error(exc.message)
        return exc.status
    except KeyboardInterrupt:
        _error("interrupted", prefix=False)
        return INTERRUPTED
    except BrokenPipeError:  # the reader went away (| head): nothing more to say
        _quiet_stdout()
        return OK
    except Exception as exc:  # a bug or a surprising answer: one line all the same
        _error(f"unexpected {type(exc).__name__}: {exc}")
        return FAILED


def _error(message: str, *, prefix: bool = True) -> None:
    try:
        sys.stdout.flush()
    except (BrokenPipeError, OSError, ValueError):
        _quiet_stdout()
    try:
        sys.stderr.write(("gateway ops: " if prefix else "") + _clean(message) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so nothing fails again when Python flushes it at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
