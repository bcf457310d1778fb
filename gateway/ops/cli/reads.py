"""The read commands of ``gateway ops``: sessions, lanes, a lane, its log and costs, what waits.

Each prints a table (or lines) for people, or with ``--json`` the API's JSON as it came.
"""

from __future__ import annotations

from typing import Any

from gateway.invocation import command as typed_command
from gateway.ops.cli.client import PAGE
from gateway.ops.cli.errors import OK, OpsError
from gateway.ops.cli.output import (
    age,
    attempts,
    call_line,
    clean,
    clip,
    cost,
    revoked_line,
    seg,
    time_of,
    when,
    why,
)
from gateway.ops.cli.run import Run

__all__ = [
    "action",
    "audit",
    "backlog",
    "deliveries",
    "lane",
    "lanes",
    "mcp",
    "sessions",
    "timeline",
    "usage",
]


def sessions(run: Run) -> int:
    """The sessions: id, name, lanes, holder, creation time."""
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
            when(s.get("created_at_ms")),
            clip(f"revoked: {s['revoked'].get('why')}", 40) if s.get("revoked") else "",
        ]
        for s in page["items"]
    ]
    headers = ["SESSION", "NAME", "LANES", "HELD BY", "CREATED (UTC)", "AUTHORITY"]
    run.table(headers, rows, "no sessions")
    return OK


def lanes(run: Run) -> int:
    """Lanes with their status and why (all pages), by session and status."""
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
            v.get("lane_spelled") or v.get("lane"),  # a look-alike name spelled out
            v.get("status"),
            clip(why(v), 40),
            attempts(v),
            clip(v.get("activity") or "", 60),
        ]
        for v in page["items"]
    ]
    headers = ["SESSION", "LANE", "STATUS", "WHY", "ATTEMPTS", "ACTIVITY"]
    if not rows and args.session and not _session_exists(run, args.session):
        # a typo read as an empty session ("no lanes match", exit 0)
        raise OpsError(
            f"no session {clean(args.session)!r} ({typed_command()} ops sessions lists them)"
        )
    run.table(headers, rows, "no lanes match")
    return OK


def _session_exists(run: Run, session: str) -> bool:
    listed = run.client.pages("/sessions", {})["items"]
    return any(s.get("id") == session or s.get("name") == session for s in listed)


def lane(run: Run) -> int:
    """One lane in full: status, error, thread, pending approvals, interrupted calls."""
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
        ("spelled", view.get("lane_spelled")),  # letters of two scripts: look-alike names
        ("session", view.get("session")),
        ("id", view.get("id")),
        ("status", status),
        ("attempts", attempts(view) or None),
        ("activity", view.get("activity")),
        ("last outcome", view.get("last_outcome")),
        ("error", f"{error.get('code')}: {error.get('message')}" if error else None),
        ("fault", view.get("fault")),
        ("queued", view.get("queued") or None),
        ("token budget", view.get("token_budget")),
        (
            "thread",
            " ".join(str(thread.get(k)) for k in ("channel", "space", "thread") if thread.get(k))
            or None,
        ),
        ("held by", view.get("held_by")),
        (
            "revoked",
            revoked_line(view["revoked"]).removeprefix("revoked: ")
            if view.get("revoked")
            else None,
        ),
        ("actions", ", ".join(view.get("actions") or []) or "none"),
    ]
    width = max(len(name) for name, _ in fields)
    run.say(*(f"{name:<{width}}  {clean(value)}" for name, value in fields if value is not None))
    pending = view.get("pending_approvals") or []
    if pending:
        run.say(f"pending approvals (wait {clean(view.get('wait_id'))}):")
        run.say(*(f"  {call_line(call)}" for call in pending))
    interrupted = view.get("interrupted_calls") or []
    if interrupted:
        run.say("interrupted tool calls (what a resume does, by --tool-recovery):")
        for call in interrupted:
            run.say(
                f"  {clean(call.get('tool_call_id'))}  {clean(call.get('tool_name'))} "
                f"(started replay={clean(call.get('replay'))})"
            )
            for policy, effect in (call.get("on_resume") or {}).items():
                run.say(f"    {clean(policy)}: {clean(effect)}")
    return OK


def timeline(run: Run) -> int:
    """A lane's log, oldest first, with its audit events among the entries."""
    view = run.lane(run.args.lane)
    page = run.client.pages(
        f"/lanes/{seg(str(view['id']))}/timeline", {}, limit=run.args.limit, size=500
    )
    if run.wants_json:
        run.json(page)
        return OK
    more = bool(page.get("next_cursor"))
    rows = _with_audit(page["items"], page.get("audit") or [], complete=not more)
    run.table(["SEQ", "TIME", "TYPE", "SUMMARY"], rows, "the lane's log is empty")
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
            [item.get("seq"), time_of(item.get("at_ms")), item.get("type"), item.get("summary")]
        )
    if complete:
        rows.extend(_audit_row(e) for e in events)
    return rows


def _audit_row(event: dict[str, Any]) -> list[Any]:
    said = f"{event.get('action')} by {event.get('actor')}: {event.get('outcome')}"
    return ["-", time_of(event.get("at_ms")), "audit", said]


def usage(run: Run) -> int:
    """A lane's cost ledger and its total."""
    view = run.lane(run.args.lane)
    page = run.client.pages(f"/lanes/{seg(str(view['id']))}/usage", {})
    if run.wants_json:
        run.json(page)
        return OK
    rows = []
    for item in page["items"]:
        usage = item.get("usage") or {}
        rows.append(
            [
                item.get("seq"),
                time_of(item.get("at_ms")),
                item.get("cause"),
                item.get("attempt") or "",
                item.get("stop_reason") or "",
                usage.get("input"),
                usage.get("output"),
                cost(usage),
            ]
        )
    headers = ["SEQ", "TIME", "CAUSE", "ATTEMPT", "STOP", "IN", "OUT", "COST"]
    run.table(headers, rows, "no usage recorded")
    total = page.get("total") or {}
    spent = total.get("total_tokens", 0)
    run.say(
        f"total: {total.get('input', 0)} in / {total.get('output', 0)} out, "
        f"{spent} tokens, cost {cost(total)}"
    )
    budget = page.get("budget")
    if isinstance(budget, int) and isinstance(spent, int):
        left = f"{budget - spent} left" if spent < budget else "spent: its runs stop"
        run.say(f"budget: {budget} tokens, {left}")
    elif budget is None:  # said, so "no line" is never read as "not looked at"
        run.say("budget: none (GATEWAY_TOKEN_BUDGET or the profile's token_budget sets one)")
    return OK


def backlog(run: Run) -> int:
    """What waits in the inbox and the outbox."""
    view = run.client.get("/backlog")
    if run.wants_json:
        run.json(view)
        return OK
    run.say(
        f"inbox:  {view.get('inbox_pending')} pending "
        f"(oldest {age(view.get('inbox_oldest_age_ms'))}), {view.get('inbox_rejected')} rejected",
        f"outbox: {view.get('outbox_pending')} pending "
        f"(oldest due {age(view.get('outbox_oldest_age_ms'))}), "
        f"{view.get('dead_letters')} dead letters",
    )
    return OK


def deliveries(run: Run) -> int:
    """Outbound messages of one status (dead letters by default)."""
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
            clip(_fault(d), 40),
            clip(d.get("text") or d.get("kind") or "", 60),
        ]
        for d in page["items"]
    ]
    headers = ["ID", "LANE", "STATUS", "ATTEMPTS", "ERROR", "TEXT"]
    run.table(headers, rows, f"no {run.args.status} deliveries")
    return OK


def _fault(delivery: dict[str, Any]) -> str:
    """A delivery's last error, said as past once it was delivered after it (or redelivered)."""
    said = delivery.get("last_error") or ""
    if said and delivery.get("status") in ("delivered", "discarded"):
        return f"(before: {said})"
    return str(said)


def audit(run: Run) -> int:
    """The audit trail: who did what, when, with which outcome."""
    args = run.args
    lane = args.lane
    session = args.session
    if lane and lane.startswith("ln_"):
        view = run.lane(lane)
        lane, session = view.get("lane"), session or view.get("session")
    page = run.client.pages(
        "/audit", {"session": session, "lane": lane}, limit=args.limit, size=min(args.limit, PAGE)
    )
    if run.wants_json:
        run.json(page)
        return OK
    rows = [
        [
            when(e.get("at_ms")),
            e.get("actor"),
            e.get("action"),
            f"{e.get('session') or '-'}/{e.get('lane') or '-'}",
            e.get("target") or "",  # an id an operator copies (`ops redeliver`): never cut
            e.get("outcome"),
        ]
        for e in page["items"]
    ]
    headers = ["TIME (UTC)", "ACTOR", "ACTION", "LANE", "TARGET", "OUTCOME"]
    run.table(headers, rows, "no audit events")
    return OK


def action(run: Run) -> int:
    """Where an action stands (after 'still running')."""
    result = run.client.get(f"/actions/{seg(run.args.action_id)}")
    if run.wants_json:
        run.json(result)
        return OK
    state = clean(result.get("status"))
    if result.get("outcome"):
        state += f", {clean(result.get('outcome'))}"
    run.say(
        f"{clean(result.get('id'))}: {clean(result.get('kind'))} "
        f"{clean(result.get('session'))}/{clean(result.get('lane'))}: {state}"
    )
    return OK


def mcp(run: Run) -> int:
    """The configured MCP servers: what each runs or reaches, its state, tools and faults."""
    view = run.client.get("/mcp")
    if run.wants_json:
        run.json(view)
        return OK
    servers = view.get("servers") or []
    rows = []
    for server in servers:
        state = str(server.get("state"))
        if state == "restarting" and server.get("retry_at_ms"):
            state += f" (next {time_of(server.get('retry_at_ms'))})"
        rows.append(
            [
                server.get("name"),
                server.get("transport"),
                clip(str(server.get("target") or ""), 40),
                state,
                "yes" if server.get("trusted") else "no",
                len(server.get("tools") or []),
                server.get("restarts"),
                f"{server.get('calls')}/{server.get('failures')}",
                clip(server.get("last_error") or "", 60),
            ]
        )
    headers = [
        "NAME",
        "TRANSPORT",
        "TARGET",
        "STATE",
        "TRUSTED",
        "TOOLS",
        "RESTARTS",
        "CALLS/FAILURES",
        "LAST ERROR",
    ]
    run.table(headers, rows, "no MCP servers configured")
    for server in servers:  # why a server stopped is often only in what it printed
        if server.get("stderr") and server.get("state") != "ready":
            run.say(clean(f"{server.get('name')}'s stderr ended with: {server.get('stderr')}"))
    if run.args.tools:
        for server in servers:
            tools = ", ".join(str(t) for t in server.get("tools") or []) or "(none)"
            run.say(clean(f"{server.get('name')}: {tools}"))
    return OK
