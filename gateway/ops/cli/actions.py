"""The action commands of ``gateway ops``: on a lane (resume, abort, rewind...), on a delivery.

An action on a lane says what it will do and asks first (``--yes`` without a terminal), then
prints one line: its result, or where to check on it.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from gateway.ops.cli.errors import OK, USAGE, OpsError
from gateway.ops.cli.output import Json, call_line, clean, revoked_line, seg, state_line, when
from gateway.ops.cli.run import Run
from harness_core.session.records import MAX_SUPPLIED_CHARS

__all__ = [
    "abort",
    "budget",
    "decide",
    "discard",
    "redeliver",
    "resume",
    "retry",
    "revoke",
    "rewind",
    "supplied_text",
    "unrevoke",
]


def resume(run: Run) -> int:
    """Resume (or unstick) a lane, after saying what becomes of its interrupted calls."""
    command = run.args.command
    view = run.lane(run.args.lane)
    policy = run.args.tool_recovery
    lines = [state_line(view)]
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
                f"  {clean(call.get('tool_name'))} {clean(call.get('tool_call_id'))} "
                f"(started replay={clean(call.get('replay'))}): {clean(effect)}"
            )
    else:
        lines.append("no tool call is left without a result")
    run.confirm(command in (view.get("actions") or []), lines, command)
    verb = "resumed" if command == "resume" else "unstuck"
    return run.act(verb, view, command, {"tool_recovery": policy})


def abort(run: Run) -> int:
    """Abort a lane's open operation."""
    view = run.lane(run.args.lane)
    lines = [
        state_line(view),
        "abort ends its open operation (what it did so far stays in the log)",
    ]
    run.confirm("abort" in (view.get("actions") or []), lines, "abort")
    return run.act("aborted", view, "abort")


def rewind(run: Run) -> int:
    """Run a lane again from just before one of its messages."""
    view = run.lane(run.args.lane)
    entry = run.args.entry_id
    lines = [
        state_line(view),
        f"rewind moves it to just before message {clean(entry)} and runs it again "
        "(the current branch stays in the log)",
    ]
    ran = _never_repeated_since(run, view, str(entry))
    if ran:  # it re-ran a send under a new key, which no receiver could tell from a new one
        lines.append(
            "after that message these ran, each declared never to run twice; the run again may "
            f"call them again, as new calls: {', '.join(ran)}"
        )
    run.confirm("rewind" in (view.get("actions") or []), lines, "rewind")
    return run.act("rewound", view, "rewind", {"entry_id": entry})


def _never_repeated_since(run: Run, view: Json, entry: str) -> list[str]:
    """The never-replayed tools the lane started after `entry` (by name, with how often)."""
    page = run.client.pages(
        f"/lanes/{seg(str(view['id']))}/timeline", {}, limit=_REWIND_LOOK, size=500
    )
    counts: dict[str, int] = {}
    after = False
    for item in page.get("items") or []:
        if not isinstance(item, dict):
            continue
        if item.get("kind") == "entry" and item.get("id") == entry:
            after = True
            continue
        data = item.get("data")
        if (
            after
            and isinstance(data, dict)
            and item.get("type") == "tool_started"
            and data.get("replay") == "never"
        ):
            name = clean(data.get("tool_name"))
            counts[name] = counts.get(name, 0) + 1
    return [name if n == 1 else f"{name} (x{n})" for name, n in counts.items()]


_REWIND_LOOK = 5_000
"""How many items of a lane's log a rewind's preview reads for the calls it may repeat."""


def retry(run: Run) -> int:
    """Run a failed run again from its first message."""
    view = run.lane(run.args.lane)
    lines = [
        state_line(view),
        "retry runs the failed run again from its first message (the failed branch stays)",
    ]
    run.confirm("retry" in (view.get("actions") or []), lines, "retry")
    return run.act("retried", view, "retry")


def decide(run: Run) -> int:
    """Approve, deny or supply the result of every call a lane waits on (--call, or --all)."""
    args = run.args
    command = args.command
    choice: Json = {"action": command}
    if command == "supply":  # judged before the lane is read: nothing is sent for bad input
        choice.update(result=supplied_text(args), is_error=bool(args.error))
    view = run.lane(args.lane)
    name = clean(view.get("lane"))
    pending = view.get("pending_approvals") or []
    wait_id = view.get("wait_id")
    if view.get("status") != "suspended" or view.get("suspended") != "approval" or not pending:
        # asked again with the key a Ctrl-C named: the first decision moved the lane on, and
        # its request cannot be rebuilt from what the lane shows now; what it did is said
        earlier = run.earlier()
        if earlier is not None:
            return run.said(_DONE[command], view, 200, earlier)
        status = clean(view.get("status"))
        if view.get("suspended"):
            status += f" ({clean(view.get('suspended'))})"
        raise OpsError(
            f"{name} waits on no approval: it is {status}{_decided_before(view, args.call)}"
        )
    ids = [str(call.get("tool_call_id")) for call in pending]
    if args.all:
        chosen = ids
    else:
        chosen = list(dict.fromkeys(args.call))
        unknown = [c for c in chosen if c not in ids]
        missing = [c for c in ids if c not in chosen]
        if unknown or missing:
            listed = ", ".join(call_line(call) for call in pending)
            problems = []
            if unknown:
                problems.append(f"not pending: {', '.join(map(clean, unknown))}")
            if missing:
                problems.append(f"not named: {', '.join(map(clean, missing))}")
            raise OpsError(
                f"{'; '.join(problems)}. {name} waits on {len(ids)} "
                f"call{'s' if len(ids) > 1 else ''}: {listed}. One decision covers every pending "
                f"call: name them all with --call, or use --all (nothing was sent)"
            )
    if args.reason is not None:
        choice["reason"] = args.reason
    # what is decided is what waits now, which may not be what the operator read a minute
    # ago: it is shown whole, and asked about (or --yes), as every other action is
    by_id = {str(call.get("tool_call_id")): call for call in pending}
    lines = [
        state_line(view),
        f"{command} {'this call' if len(chosen) == 1 else f'these {len(chosen)} calls'} "
        f"(wait {clean(wait_id)}):",
        *(f"  {_whole_call(by_id[call_id])}" for call_id in chosen),
    ]
    run.confirm(True, lines, command)
    body = {"wait_id": wait_id, "approvals": {call_id: dict(choice) for call_id in chosen}}
    return run.act(_DONE[command], view, "decisions", body)


def _decided_before(view: Json, named: list[str] | None) -> str:
    """Whose decision came first: ``; c1 was approved by operator:alice at 12:00:03 UTC``."""
    last = view.get("last_decision")
    if not isinstance(last, dict) or not isinstance(last.get("calls"), dict):
        return ""
    calls: dict[str, Any] = last["calls"]
    chosen = [c for c in dict.fromkeys(named or ()) if c in calls] or list(calls)
    said = ", ".join(f"{clean(c)} was {clean(calls[c])}" for c in chosen)
    by = f" by {clean(last.get('decided_by'))}" if last.get("decided_by") else ""
    at = when(last.get("at_ms"))
    return f"; its last request (wait {clean(last.get('wait_id'))}): {said}{by} at {at} UTC"


def _whole_call(call: Json) -> str:
    """A pending call with its arguments unclipped (up to 4,000 characters): what is decided."""
    arguments = json.dumps(call.get("arguments", {}), ensure_ascii=False, separators=(",", ":"))
    if len(arguments) > 4000:
        arguments = arguments[:4000] + f"... ({len(arguments):,} characters in all)"
    return clean(f"{call.get('tool_call_id')} {call.get('tool_name')}({arguments})")


_DONE = {"approve": "approved", "deny": "denied", "supply": "supplied the result for"}


def supplied_text(args: Any) -> str:
    """The result ``supply`` gives: --result, or --result-file (``-``: standard input)."""
    if args.result is not None:
        text, where = args.result, "--result"
    else:
        where = "standard input" if args.result_file == "-" else clean(args.result_file)
        try:
            if args.result_file == "-":
                text = sys.stdin.read(MAX_SUPPLIED_CHARS + 1)
            else:
                with open(args.result_file, encoding="utf-8") as given:
                    text = given.read(MAX_SUPPLIED_CHARS + 1)
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8"
            raise OpsError(f"cannot read the result from {where}: {clean(reason)}", USAGE) from None
    if not text.strip():
        raise OpsError(
            f"the result from {where} is empty: say what the action did (nothing was sent)", USAGE
        )
    if len(text) > MAX_SUPPLIED_CHARS:  # a file or stdin is read only that far
        raise OpsError(
            f"the result from {where} has more than {MAX_SUPPLIED_CHARS:,} characters, the "
            "limit: shorten it (nothing was sent)",
            USAGE,
        )
    return str(text)


def budget(run: Run) -> int:
    """Set a lane's token budget over its profile's, or give it its profile's again (D295)."""
    args = run.args
    lane = run.lane(args.lane)
    body = {"tokens": None if args.reset else args.tokens, "reason": args.reason}
    _, view = run.client.request("PUT", f"/lanes/{seg(str(lane['id']))}/budget", body=body)
    if run.wants_json:
        run.json(view)
        return OK
    name = f"{clean(lane.get('session'))}/{clean(lane.get('lane'))}"
    spent, given = view.get("spent"), view.get("profile_budget")
    if args.reset:
        if given is None:  # it said "None tokens"
            run.say(f"{name} has its profile's budget again: none (spent {spent})")
        else:
            run.say(f"{name} has its profile's budget again: {given} tokens (spent {spent})")
        return OK
    if view.get("changed"):
        said = f"{name} may spend {view.get('budget')} tokens in all now"
    else:
        said = f"{name}'s budget was {view.get('budget')} tokens already"
    run.say(f"{said} (spent {spent}; its profile's budget: {given})")
    return OK


def revoke(run: Run) -> int:
    """Withdraw the authority of a lane, or of every lane of a session (D267)."""
    args = run.args
    body = {"reason": args.reason} if args.reason else None
    if args.lane is None:
        session = args.session
        lines = [
            f"revoke withdraws the authority of every lane of session {clean(session)}: their "
            "open runs end (authority_revoked), their new messages are kept and not run, "
            "nothing more is posted in their threads"
        ]
        run.confirm(True, lines, "revoke")
        _, view = run.client.request("POST", f"/sessions/{seg(session)}/revoke", body=body)
        return _authority(run, view, f"session {clean(session)}", "revoked")
    lane = run.lane(f"{args.session}/{args.lane}")
    lines = [
        state_line(lane),
        "revoke withdraws its authority: its open run ends (authority_revoked), its new "
        "messages are kept and not run, nothing more is posted in its thread",
    ]
    run.confirm(True, lines, "revoke")
    _, view = run.client.request("POST", f"/lanes/{seg(str(lane['id']))}/revoke", body=body)
    return _authority(
        run, view, f"{clean(lane.get('session'))}/{clean(lane.get('lane'))}", "revoked"
    )


def unrevoke(run: Run) -> int:
    """Give a lane (or a session) its authority back; new messages run again."""
    args = run.args
    body = {"reason": args.reason} if args.reason else None
    if args.lane is None:
        session = args.session
        _, view = run.client.request("POST", f"/sessions/{seg(session)}/unrevoke", body=body)
        return _authority(run, view, f"session {clean(session)}", "restored")
    lane = run.lane(f"{args.session}/{args.lane}")
    _, view = run.client.request("POST", f"/lanes/{seg(str(lane['id']))}/unrevoke", body=body)
    return _authority(
        run, view, f"{clean(lane.get('session'))}/{clean(lane.get('lane'))}", "restored"
    )


def _authority(run: Run, view: Json, name: str, verb: str) -> int:
    if run.wants_json:
        run.json(view)
        return OK
    revoked = view.get("revoked")
    if revoked is not None:
        said = revoked_line(revoked)
        run.say(
            f"{verb} {name}: {said}"
            if view.get("changed")
            else f"{name} was revoked already: {said}"
        )
    elif view.get("changed"):
        run.say(f"{verb} {name}: its authority is back (by {clean(view.get('restored_by'))})")
    else:
        run.say(f"{name} was not revoked: nothing changed")
    return OK


def redeliver(run: Run) -> int:
    """Send a dead letter again with fresh attempts."""
    return _delivery_action(run, "redeliver", "redelivered")


def discard(run: Run) -> int:
    """Give up on a dead or pending delivery."""
    delivery = run.args.delivery_id
    lines = [f"discard gives up on delivery {clean(delivery)}: it will not be sent"]
    run.confirm(True, lines, "discard")
    return _delivery_action(run, "discard", "discarded")


def _delivery_action(run: Run, path: str, verb: str) -> int:
    delivery = run.args.delivery_id
    _, view = run.client.request("POST", f"/deliveries/{seg(delivery)}/{path}", key=run.key())
    if run.wants_json:
        run.json(view)
        return OK
    run.say(
        f"{verb} {clean(view.get('id'))} ({clean(view.get('session'))}/"
        f"{clean(view.get('lane'))}): {clean(view.get('status'))}"
    )
    return OK
