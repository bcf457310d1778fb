"""`gateway ops`: the operator API from the terminal, against a real `gateway serve` process.

One process (tokens for alice the operator and bob the viewer, the test agent of
tests/support/gateway_agent.py) serves the module; each test writes in its own web threads and
runs the command in-process (`main`, output captured) or as ``python -m gateway ops`` when what
matters is the process: no traceback, a closed pipe, Ctrl-C, nothing written to disk. The local
token file and a stuck lane get a process of their own (no tokens configured, one attempt).
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.channels import gateway_settings
from gateway.ops.cli import main
from gateway.ops.cli import run as cli_run
from gateway.ops.cli.target import Target
from harness_core.session.records import MAX_SUPPLIED_CHARS
from tests.support.gateway_process import ROOT, GatewayProcess
from tests.support.redis_server import free_port

AGENT = "tests.support.gateway_agent"
OPERATOR = "cli-operator-secret-0123456789"
VIEWER = "cli-viewer-secret-0123456789ab"
LANE_HEADERS = ["SESSION", "LANE", "STATUS", "WHY", "ATTEMPTS", "ACTIVITY"]


class Gateway:
    """The module's `gateway serve` and what the tests do with it beside the command."""

    def __init__(self, process: GatewayProcess) -> None:
        self.process = process
        self.url = process.url

    def post(self, thread: str, text: str, space: str | None = None) -> dict[str, Any]:
        body = {"text": text, **({"space": space} if space else {})}
        response = httpx.post(f"{self.url}/web/threads/{thread}/messages", json=body, timeout=10)
        assert response.status_code == 202, response.text
        accepted: dict[str, Any] = response.json()
        return accepted

    def answers(self, thread: str, count: int) -> list[dict[str, Any]]:
        return _answers(self.url, thread, count)

    def lane(self, lane: str, *statuses: str) -> dict[str, Any]:
        return _until_status(self.url, VIEWER, lane, *statuses)


def _answers(url: str, thread: str, count: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 20
    while True:
        items = httpx.get(f"{url}/web/threads/{thread}", timeout=10).json()["items"]
        found = [i for i in items if i["kind"] not in ("message", "decision", "approval_closed")]
        if len(found) >= count:
            return found
        assert time.monotonic() < deadline, found
        time.sleep(0.05)


def _until_status(url: str, token: str, lane: str, *statuses: str) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while True:
        listed = httpx.get(
            f"{url}/api/v1/lanes", headers={"Authorization": f"Bearer {token}"}, timeout=10
        ).json()["items"]
        found = [v for v in listed if v["lane"] == lane]
        if found and found[0]["status"] in statuses:
            view: dict[str, Any] = found[0]
            return view
        assert time.monotonic() < deadline, found
        time.sleep(0.05)


@dataclass
class Ran:
    code: int
    out: str
    err: str


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    directory = tmp_path_factory.mktemp("ops-cli")
    settings = {
        "store_url": f"sqlite:///{directory}/store.db",
        "broker_url": f"sqlite:///{directory}/broker.db",
        "web_url": f"sqlite:///{directory}/web.db",
        "plugin": AGENT,
        "ops_tokens": f"alice:operator:{OPERATOR},bob:viewer:{VIEWER}",
        "token_budget": "1000000",  # shown by `lane` and `usage`
    }
    process = GatewayProcess("gw", directory, settings).start()
    try:
        yield Gateway(process)
    finally:
        process.stop()
    assert "Traceback" not in process.tail(400)


@pytest.fixture
def ops(gateway: Gateway, capsys: pytest.CaptureFixture[str]) -> Any:
    """`ops(*words, token=...)`: the command in-process against the module's gateway."""

    def run(*words: str, token: str = OPERATOR) -> Ran:
        code = main(["--url", gateway.url, "--token", token, *words], None)
        out, err = capsys.readouterr()
        return Ran(code, out, err)

    return run


def _one_line(text: str) -> str:
    assert text.endswith("\n") and text.count("\n") == 1, text
    assert "Traceback" not in text
    return text


def _process_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def _gateway_ops(*words: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "ops", *words],
        cwd=cwd,
        env=_process_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
    )


# -- reads -----------------------------------------------------------------------------------


def test_lanes_as_a_table_as_json_and_filtered(gateway: Gateway, ops: Any) -> None:
    gateway.post("t-one", "hello")
    gateway.post("t-two", "/fail")
    gateway.lane("web:t-one", "idle")
    gateway.lane("web:t-two", "failed")

    ran = ops("lanes")
    assert ran.code == 0 and ran.err == "", ran
    header, *rows = ran.out.splitlines()
    assert header.split() == LANE_HEADERS
    [one] = [row for row in rows if " web:t-one " in row]
    [two] = [row for row in rows if " web:t-two " in row]
    # the columns line up under their headers
    assert one[header.index("STATUS") :].startswith("idle ")
    assert two[header.index("STATUS") :].startswith("failed ")
    assert two[header.index("WHY") :].startswith("auth: the key was refused")
    assert two.startswith("web-default ")

    listed = ops("lanes", "--json")
    assert listed.code == 0
    page = json.loads(listed.out)
    assert page["next_cursor"] is None
    views = {v["lane"]: v for v in page["items"]}
    assert views["web:t-two"]["status"] == "failed" and views["web:t-two"]["id"].startswith("ln_")

    failed = ops("lanes", "--status", "failed")
    rows = [row.split() for row in failed.out.splitlines()[1:]]
    assert ["web:t-two", "failed"] in [row[1:3] for row in rows]
    assert {row[2] for row in rows} == {"failed"}
    stuck = ops("lanes", "--stuck")  # none is stuck here (the stuck one has its own test)
    assert (stuck.code, stuck.out, stuck.err) == (0, "", "no lanes match\n")
    typo = ops("lanes", "--session", "web-defualt")  # read as an empty session, exit 0
    assert typo.code == 1 and "no session 'web-defualt'" in typo.err, typo
    unknown = ops("lanes", "--status", "sleeping")
    assert unknown.code == 1 and "sleeping" in _one_line(unknown.err)  # the API's word

    shown = ops("lane", "web:t-two")
    assert shown.code == 0
    assert re.search(r"^status +failed$", shown.out, re.M), shown.out
    assert re.search(r"^error +auth: the key was refused$", shown.out, re.M)
    assert re.search(r"^actions +rewind, retry$", shown.out, re.M)


def test_timeline_of_a_lane_by_name_id_or_session_and_name(gateway: Gateway, ops: Any) -> None:
    accepted = gateway.post("tl", "hello\x1b[31m timeline")
    gateway.answers("tl", 1)
    gateway.post("tl", "again", space="elsewhere")  # web:tl in a second session too
    gateway.answers("tl", 1)
    session = accepted["session"]
    _until_status(gateway.url, VIEWER, "web:tl", "idle")

    ambiguous = ops("timeline", "web:tl")
    assert ambiguous.code == 2
    assert "2 sessions" in _one_line(ambiguous.err) and f"{session}/web:tl" in ambiguous.err

    ran = ops("timeline", f"{session}/web:tl")
    assert ran.code == 0, ran
    header, *rows = ran.out.splitlines()
    assert header.split() == ["SEQ", "TIME", "TYPE", "SUMMARY"]
    assert all(re.match(r"\d+ +\d\d:\d\d:\d\d +\w+ +\S", row) for row in rows), rows
    summaries = [row[header.index("SUMMARY") :] for row in rows]
    assert "user: hello\\x1b[31m timeline" in summaries  # an escape is shown, not obeyed
    assert "assistant: You said: hello\\x1b[31m timeline" in summaries

    short = ops("timeline", f"{session}/web:tl", "--limit", "2", "--json")
    page = json.loads(short.out)
    assert len(page["items"]) == 2 and page["next_cursor"]
    lane_id = json.loads(ops("lane", f"{session}/web:tl", "--json").out)["id"]
    by_id = ops("timeline", lane_id, "--limit", "3")
    assert by_id.code == 0 and len(by_id.out.splitlines()) == 4
    assert "--limit" in by_id.err  # it says there is more

    missing = ops("timeline", "web:no-such-thread")
    assert missing.code == 1 and "no lane 'web:no-such-thread'" in _one_line(missing.err)
    usage = ops("usage", f"{session}/web:tl")
    *_, total, budget = usage.out.splitlines()
    assert usage.code == 0 and total.startswith("total: ")
    spent = int(re.findall(r"(\d+) tokens", total)[0])
    assert budget == f"budget: 1000000 tokens, {1000000 - spent} left"
    assert "token budget  1000000" in ops("lane", f"{session}/web:tl").out


def test_timeline_shows_who_stopped_the_run_among_the_log(gateway: Gateway, ops: Any) -> None:
    gateway.post("tl-stop", "/slow 3000")
    gateway.lane("web:tl-stop", "running")
    gateway.post("tl-stop", "stop")
    [stopped] = gateway.answers("tl-stop", 1)
    assert stopped["text"] == "Stopped."
    view = gateway.lane("web:tl-stop", "idle")
    ran = ops("timeline", f"{view['session']}/web:tl-stop")
    assert ran.code == 0, ran
    _, *rows = ran.out.splitlines()
    types = [row.split()[2] for row in rows]
    audited = [row for row in rows if row.split()[2] == "audit"]
    assert len(audited) == 1
    assert re.match(
        r"- +\d\d:\d\d:\d\d +audit +stop requested by web:anonymous: stopped$", audited[0]
    )
    # among the log, by time: after the abort was written, before the run finished
    assert types.index("abort_requested") < types.index("audit")
    assert types.index("audit") < types.index("operation_finished")


# -- actions ---------------------------------------------------------------------------------


def test_approve_all_completes_a_suspended_approval(gateway: Gateway, ops: Any) -> None:
    gateway.post("ship", "/deploy prod")
    view = gateway.lane("web:ship", "suspended")
    [call] = view["pending_approvals"]

    shown = ops("lane", "web:ship")
    assert f'{call["tool_call_id"]} deploy({{"target":"prod"}})' in shown.out

    unnamed = ops("approve", "web:ship", "--call", "call-x")
    assert unnamed.code == 1
    line = _one_line(unnamed.err)
    assert "not pending: call-x" in line and call["tool_call_id"] in line and "--all" in line

    no_reason = ops("deny", "web:ship", "--all")
    assert no_reason.code == 2 and "--reason" in no_reason.err  # argparse's own usage error

    unconfirmed = ops("approve", "web:ship", "--all")  # no terminal here to ask on
    assert unconfirmed.code == 2 and "approve needs confirmation: pass --yes" in unconfirmed.err
    viewer = ops("approve", "web:ship", "--all", "--yes", token=VIEWER)
    assert viewer.code == 1 and "operator" in viewer.err.splitlines()[-1]
    assert gateway.lane("web:ship", "suspended")["wait_id"] == view["wait_id"]  # nothing done

    key = ("--idempotency-key", "cli-ship-1")
    approved = ops("approve", "web:ship", "--all", "--reason", "ship it", "--yes", *key)
    assert approved.code == 0, approved
    found = re.fullmatch(r"approved web:ship: completed \(action (act_\w+)\)\n", approved.out)
    assert found, approved.out
    answers = gateway.answers("ship", 2)
    assert answers[-1]["text"] == "Done: deployed prod"
    # the retry a Ctrl-C names, once the lane moved on: what the key did (it read "web:ship
    # waits on no approval: it is idle", as if nobody had approved)
    again = ops("approve", "web:ship", "--all", "--yes", *key)
    assert (again.code, again.out) == (0, approved.out), again
    other = ops("approve", "web:ship", "--all", "--yes", "--idempotency-key", "cli-never-used")
    assert other.code == 1 and "waits on no approval: it is idle" in other.err
    # and whose decision came first, as the web channel and the API say
    said = _one_line(other.err)
    assert f"{call['tool_call_id']} was approved by operator:alice at " in said, said
    assert f"(wait {view['wait_id']})" in said

    polled = ops("action", found.group(1))
    assert polled.code == 0
    assert polled.out == f"{found.group(1)}: decide web-default/web:ship: done, completed\n"
    trail = ops("audit", "--lane", "web:ship")
    [event] = [row for row in trail.out.splitlines() if " decide " in row]
    assert "operator:alice" in event and event.endswith("completed")

    gateway.post("ship-no", "/deploy moon")
    [moon] = gateway.lane("web:ship-no", "suspended")["pending_approvals"]
    denied = ops(
        "deny", "web:ship-no", "--call", moon["tool_call_id"], "--reason", "not the moon", "-y"
    )
    assert denied.code == 0 and denied.out.startswith("denied web:ship-no: "), denied


def test_supply_answers_the_pending_calls_with_their_result(
    gateway: Gateway, ops: Any, tmp_path: Path
) -> None:
    """D263: the operator did the deploy by hand; the tool never runs, the agent reads it."""
    gateway.post("by-hand", "/deploy prod")
    view = gateway.lane("web:by-hand", "suspended")
    [call] = view["pending_approvals"]

    blank = ops("supply", "web:by-hand", "--all", "--result", "  \n ")
    assert blank.code == 2 and "is empty" in _one_line(blank.err)
    huge = tmp_path / "huge.txt"
    huge.write_text("x" * (MAX_SUPPLIED_CHARS + 1), encoding="utf-8")
    over = ops("supply", "web:by-hand", "--all", "--result-file", str(huge))
    assert over.code == 2 and "more than 100,000 characters" in _one_line(over.err)
    missing = ops("supply", "web:by-hand", "--all", "--result-file", str(tmp_path / "none"))
    assert missing.code == 2 and "cannot read the result from" in _one_line(missing.err)
    neither = ops("supply", "web:by-hand", "--all")
    assert neither.code == 2 and "--result" in neither.err  # argparse's own usage error
    viewer = ops("supply", "web:by-hand", "--all", "--result", "done", "--yes", token=VIEWER)
    shown, refusal = viewer.err.rstrip("\n").rsplit("\n", 1)
    assert viewer.code == 1 and "operator" in refusal
    whole = f'{call["tool_call_id"]} deploy({{"target":"prod"}})'
    assert shown.endswith(f"supply this call (wait {view['wait_id']}):\n  {whole}")
    assert gateway.lane("web:by-hand", "suspended")["wait_id"] == view["wait_id"]  # nothing done

    given = tmp_path / "result.txt"
    given.write_text("deployed build 42 by hand\nfrom the console", encoding="utf-8")
    words = (
        *("supply", "web:by-hand", "--call", call["tool_call_id"]),
        *("--result-file", str(given), "--yes"),
    )
    supplied = ops(*words, "--idempotency-key", "cli-supply-1")
    assert supplied.code == 0, supplied
    assert re.fullmatch(
        r"supplied the result for web:by-hand: completed \(action act_\w+\)\n", supplied.out
    ), supplied.out
    answers = gateway.answers("by-hand", 2)
    assert answers[-1]["text"] == "Done: deployed build 42 by hand\nfrom the console"
    # sent again: nothing waits any more, nothing is sent; the same key says what it did
    again = ops(*words, "--idempotency-key", "cli-supply-1")
    assert (again.code, again.out) == (0, supplied.out), again
    other = ops(*words, "--idempotency-key", "cli-supply-2")
    assert other.code == 1 and "waits on no approval: it is idle" in _one_line(other.err)
    assert len(gateway.answers("by-hand", 2)) == 2
    timeline = ops("timeline", "web:by-hand")
    assert timeline.code == 0
    assert f"{call['tool_call_id']} result supplied: deployed build 42 by hand…" in timeline.out
    assert "[supplied by operator:alice]" in timeline.out and "tool_started" not in timeline.out

    gateway.post("by-hand-failed", "/deploy prod")
    gateway.lane("web:by-hand-failed", "suspended")
    failed = ops("supply", "web:by-hand-failed", "--all", "--result", "disk full", "--error", "-y")
    assert failed.code == 0, failed
    closed = _until_closed(gateway.url, "by-hand-failed")
    assert "operator:alice supplied the result (the action failed) at " in closed


def _until_closed(url: str, thread: str) -> str:
    deadline = time.monotonic() + 20
    while True:
        items = httpx.get(f"{url}/web/threads/{thread}", timeout=10).json()["items"]
        closed = [i["text"] for i in items if i["kind"] == "approval_closed"]
        if closed:
            return str(closed[0])
        assert time.monotonic() < deadline, items
        time.sleep(0.05)


def test_actions_need_yes_without_a_terminal_and_replay_their_key(
    gateway: Gateway, ops: Any
) -> None:
    gateway.post("busy", "/slow 2500")
    gateway.lane("web:busy", "running")

    unconfirmed = ops("abort", "web:busy")
    assert unconfirmed.code == 2 and "--yes" in _one_line(unconfirmed.err)
    assert gateway.lane("web:busy", "running")
    resume = ops("resume", "web:busy")  # resume is not for a running lane: the gateway says so
    assert resume.code == 1 and "(conflict, lane_running)" in _one_line(resume.err)

    aborted = ops("abort", "web:busy", "--yes", "--idempotency-key", "cli-test-abort-1")
    assert aborted.code == 0, aborted
    assert re.fullmatch(r"aborted web:busy: aborted \(action act_\w+\)\n", aborted.out)
    assert "is running" in aborted.err and "running tool 'slow'" in aborted.err
    again = ops("abort", "web:busy", "--yes", "--idempotency-key", "cli-test-abort-1")
    assert again.code == 0 and again.out == aborted.out  # the first result, replayed
    gateway.lane("web:busy", "idle", "failed")
    idle = ops("abort", "web:busy", "--yes")
    assert idle.code == 1 and "(conflict, lane_" in _one_line(idle.err)

    gateway.post("broken", "/fail")
    gateway.lane("web:broken", "failed")
    retried = ops("retry", "web:broken", "--yes", "--json")
    assert retried.code == 0
    result = json.loads(retried.out)
    assert (result["kind"], result["status"], result["outcome"]) == ("retry", "done", "failed")


def test_an_action_still_running_says_how_to_check_on_it(gateway: Gateway, ops: Any) -> None:
    gateway.post("later", "/slow 1500")
    gateway.lane("web:later", "idle")
    timeline = json.loads(ops("timeline", "web:later", "--json").out)["items"]
    [message] = [i for i in timeline if i["summary"] == "user: /slow 1500"]

    ran = ops("--timeout", "1", "rewind", "web:later", message["id"], "--yes")
    assert ran.code == 0, ran
    found = re.fullmatch(
        r"rewind web:later: still running; check with: gateway ops action (act_\w+)\n", ran.out
    )
    assert found, ran.out
    deadline = time.monotonic() + 20
    while (polled := ops("action", found.group(1))).out.endswith(("pending\n", "running\n")):
        assert time.monotonic() < deadline, polled
        time.sleep(0.1)
    assert polled.out.endswith(": rewind web-default/web:later: done, completed\n"), polled


def test_a_rewind_names_the_never_repeated_calls_it_may_make_again(
    gateway: Gateway, ops: Any
) -> None:
    """A rewind ran a `replay="never"` charge again, under a new key no receiver could tell
    from a new charge, and its preview said only "runs it again" (an outside probe)."""
    gateway.post("pay", "/charge 5")
    gateway.lane("web:pay", "idle")
    timeline = json.loads(ops("timeline", "web:pay", "--json").out)["items"]
    [message] = [i for i in timeline if i["summary"] == "user: /charge 5"]
    asked = ops("rewind", "web:pay", message["id"], "--yes", token=VIEWER)  # shown, refused
    assert asked.code == 1, asked
    assert (
        "after that message these ran, each declared never to run twice; the run again may "
        "call them again, as new calls: charge\n"
    ) in asked.err


def test_a_terminal_is_told_what_a_slow_action_waits_for(
    gateway: Gateway, ops: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An action's answer took up to 25 s in silence, which read as a hang (an outside probe)."""
    gateway.post("slowly", "/slow 1500")
    gateway.lane("web:slowly", "idle")
    timeline = json.loads(ops("timeline", "web:slowly", "--json").out)["items"]
    [message] = [i for i in timeline if i["summary"] == "user: /slow 1500"]
    monkeypatch.setattr(cli_run, "WAITING_NOTICE_S", 0.2)
    monkeypatch.setattr(cli_run, "_isatty", lambda stream: stream is sys.stderr)
    ran = ops("--timeout", "2", "rewind", "web:slowly", message["id"], "--yes")
    assert ran.code == 0, ran
    assert "(waiting for the worker holding web:slowly to carry it out: up to 1 s more)\n" in (
        ran.err
    )
    gateway.lane("web:slowly", "idle")
    monkeypatch.setattr(cli_run, "_isatty", lambda stream: False)  # a pipe is never told
    quiet = ops("--timeout", "2", "rewind", "web:slowly", message["id"], "--yes")
    assert quiet.code == 0 and "waiting for" not in quiet.err, quiet


# -- errors ----------------------------------------------------------------------------------


def test_a_wrong_token_and_an_unreachable_gateway_are_one_line(
    gateway: Gateway, ops: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    wrong = ops("lanes", token="not-the-token")
    assert wrong.code == 1 and wrong.out == ""
    line = _one_line(wrong.err)
    assert line.startswith("gateway ops: the token from --token was refused")
    assert "--token" in line and "GATEWAY_OPS_TOKEN" in line

    nowhere = f"http://127.0.0.1:{free_port()}"
    assert main(["--url", nowhere, "--token", OPERATOR, "lanes"], None) == 3
    out, err = capsys.readouterr()
    assert out == "" and _one_line(err).startswith(
        f"gateway ops: cannot reach the gateway at {nowhere} ("
    )
    assert err.endswith(
        "): is gateway serve running? (another address: --url or GATEWAY_OPS_URL)\n"
    )
    huge = ops("lane", "web:" + "a" * 100_000)  # was "unexpected InvalidURL"
    assert huge.code == 1 and _one_line(huge.err).startswith("gateway ops: cannot ask for that:")


def test_a_server_that_is_not_the_gateway_is_named_as_such(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A server answering JSON of another shape was "unexpected AttributeError" (a probe)."""

    class Foreign(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"items": [1, 2, 3]}'
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Foreign)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert main(["--url", url, "--token", OPERATOR, "lanes"], None) == 1
    finally:
        server.shutdown()
        server.server_close()
    out, err = capsys.readouterr()
    assert out == "" and "is --url the gateway?" in _one_line(err)


def test_a_token_file_that_cannot_be_read_is_named_not_called_missing(
    gateway: Gateway,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GATEWAY_OPS_TOKEN", raising=False)
    (tmp_path / "ops-token").mkdir()  # there, and unreadable even by root
    settings = gateway_settings(store_url=f"sqlite:///{tmp_path}/store.db")
    assert main(["--url", gateway.url, "lanes"], settings) == 1
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("gateway ops: no token was given (unauthenticated)"), line
    assert f"{tmp_path / 'ops-token'} is there but cannot be read (Is a directory)" in line


def test_a_real_process_prints_no_traceback_and_writes_nothing(
    gateway: Gateway, tmp_path: Path
) -> None:
    gateway.post("proc", "hello")
    gateway.lane("web:proc", "idle")
    # a wildcard host means this machine; GATEWAY_OPS_TOKEN is the client's, not a setting
    ran = _gateway_ops(
        "lanes",
        cwd=tmp_path,
        GATEWAY_HOST="0.0.0.0",
        GATEWAY_PORT=str(gateway.process.port),
        GATEWAY_OPS_TOKENS=f"alice:operator:{OPERATOR}",
        GATEWAY_OPS_TOKEN=VIEWER,
    )
    assert ran.returncode == 0 and ran.stderr == "", ran
    assert ran.stdout.split("\n")[0].split() == LANE_HEADERS and " web:proc " in ran.stdout
    acting = _gateway_ops(
        "abort", "web:proc", "--yes", cwd=tmp_path, GATEWAY_OPS_URL=gateway.url,
        GATEWAY_OPS_TOKEN=VIEWER,
    )  # fmt: skip
    assert acting.returncode == 1 and "operator" in _one_line(acting.stderr)
    wrong = _gateway_ops("--url", gateway.url, "--token", "nope", "backlog", cwd=tmp_path)
    assert wrong.returncode == 1 and "GATEWAY_OPS_TOKEN" in _one_line(wrong.stderr)
    nowhere = _gateway_ops("--url", f"http://127.0.0.1:{free_port()}", "sessions", cwd=tmp_path)
    assert nowhere.returncode == 3 and "is gateway serve running?" in _one_line(nowhere.stderr)
    assert list(tmp_path.iterdir()) == []  # reads write nothing: no store, no token file


def test_a_closed_pipe_ends_quietly(gateway: Gateway, tmp_path: Path) -> None:
    gateway.post("pipe", "hello")
    gateway.lane("web:pipe", "idle")
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway", "ops", "--url", gateway.url, "timeline", "web:pipe"],
        cwd=tmp_path,
        env=_process_env(GATEWAY_OPS_TOKEN=VIEWER),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # the reader is gone before anything is written (| head -0)
    with process.stderr:
        err = process.stderr.read()
    assert process.wait(timeout=60) == 0
    assert err == b""


def test_an_action_sent_and_not_answered_names_its_key_not_an_unreachable_gateway(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Its answer timed out, and it read "cannot reach the gateway ... is gateway serve
    running?" (exit 3): a retry under a new key would act twice (an outside probe)."""
    with socket.socket() as silent:  # the kernel takes the connection; nothing answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        words = ["--url", url, "--token", "t", "--timeout", "1"]
        sent = main([*words, "redeliver", "reply:s:r1", "--idempotency-key", "k-8"], None)
        acted = _one_line(capsys.readouterr().err)
        read = main([*words, "lanes"], None)
        reading = _one_line(capsys.readouterr().err)
    assert sent == 1 and "gave no answer within 1 s: the action may have reached it" in acted
    assert "--idempotency-key k-8 says what it did, and does nothing twice" in acted
    assert read == 3 and "cannot reach the gateway" in reading  # a read changes nothing


def test_an_action_whose_gateway_hangs_up_before_answering_names_its_key(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The gateway died while the approved tool ran: "cannot reach the gateway" said nothing of
    the key, though the approval was taken (an outside probe)."""
    import threading

    with socket.socket() as dying:  # takes the request, then closes without a word
        dying.bind(("127.0.0.1", 0))
        dying.listen()

        def hang_up() -> None:
            for _ in range(2):
                connection, _ = dying.accept()
                with connection:
                    connection.recv(65536)

        thread = threading.Thread(target=hang_up, daemon=True)
        thread.start()
        url = f"http://127.0.0.1:{dying.getsockname()[1]}"
        words = ["--url", url, "--token", "t", "--timeout", "5"]
        sent = main([*words, "redeliver", "reply:s:r1", "--idempotency-key", "k-9"], None)
        acted = _one_line(capsys.readouterr().err)
        read = main([*words, "lanes"], None)
        reading = _one_line(capsys.readouterr().err)
        thread.join(5)
    assert sent == 3 and "dropped the connection before it answered" in acted
    assert "--idempotency-key k-9 says what it did, and does nothing twice" in acted
    assert read == 3 and "cannot reach the gateway" in reading  # a read changes nothing


@pytest.mark.parametrize(
    ("words", "said"),
    [
        (("lanes",), b"interrupted\n"),
        # an action on its way may have been taken: it said only "interrupted"
        (("redeliver", "reply:s:r1", "--idempotency-key", "k-7"), b"--idempotency-key k-7 says"),
    ],
)
def test_ctrl_c_exits_130_without_a_traceback(
    tmp_path: Path, words: tuple[str, ...], said: bytes
) -> None:
    with socket.socket() as silent:  # accepts the connection and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        silent.settimeout(30)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        process = subprocess.Popen(
            [sys.executable, "-m", "gateway", "ops", "--url", url, "--token", "t", *words],
            cwd=tmp_path,
            env=_process_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            # a test run started in the background ignores SIGINT, and its children would too
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        try:
            connection, _ = silent.accept()
            with connection:
                connection.recv(4096)  # the request: the command now waits for the answer
                process.send_signal(signal.SIGINT)
                out, err = process.communicate(timeout=30)
        finally:  # a failure here leaves no process and pipes to a later test's collection
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert process.returncode == 130
    assert out == b"" and b"Traceback" not in err and err.count(b"\n") <= 1
    assert said in err, err


# -- the local token file, a stuck lane -----------------------------------------------------


class _Terminal:
    """A stdin that is a terminal, answering `answer`."""

    def __init__(self, answer: str) -> None:
        self.answer = answer

    def isatty(self) -> bool:
        return True

    def readline(self) -> str:
        return self.answer


@pytest.mark.timeout(90)
def test_the_local_token_file_and_a_stuck_lane_resumed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GATEWAY_OPS_URL", raising=False)
    monkeypatch.delenv("GATEWAY_OPS_TOKEN", raising=False)
    urls = {
        "store_url": f"sqlite:///{tmp_path}/store.db",
        "broker_url": f"sqlite:///{tmp_path}/broker.db",
        "web_url": f"sqlite:///{tmp_path}/web.db",
    }
    process = GatewayProcess(
        "gw", tmp_path, {**urls, "plugin": AGENT, "max_attempts": "1", "lease_seconds": "3",
                         "renew_seconds": "0.5"},
    ).start()  # fmt: skip
    settings = gateway_settings(**urls, host="127.0.0.1", port=process.port)

    def ops(*words: str) -> Ran:
        code = main(list(words), settings)
        out, err = capsys.readouterr()
        return Ran(code, out, err)

    try:
        token = (tmp_path / "ops-token").read_text().strip()  # no ops_tokens: the local one
        # the poison tool kills the process, maybe before the 202 leaves it
        with contextlib.suppress(httpx.TransportError):
            httpx.post(f"{process.url}/web/threads/p/messages", json={"text": "/poison"})
        assert process.process is not None
        process.process.wait(timeout=20)
        process.restart()  # one attempt was the budget: the lane is parked stuck
        _until_status(process.url, token, "web:p", "stuck")

        stuck = ops("lanes", "--stuck")
        assert stuck.code == 0, stuck
        header, row = stuck.out.splitlines()
        assert header.split() == LANE_HEADERS
        assert row.split()[:5] == ["web-default", "web:p", "stuck", "crash", "1/1"]
        assert row.endswith("running tool 'poison'")

        no_terminal = ops("resume", "web:p", "--tool-recovery", "never")
        assert no_terminal.code == 2 and "--yes" in _one_line(no_terminal.err)
        monkeypatch.setattr(sys, "stdin", _Terminal("n\n"))
        declined = ops("resume", "web:p", "--tool-recovery", "never")
        assert declined.code == 1 and declined.out == ""
        assert "poison call-1 (started replay=safe): reported to the model as interrupted" in (
            declined.err
        )
        assert "is stuck (crash), attempt 1 of 1" in declined.err
        assert "Proceed? [y/N] gateway ops: not confirmed: nothing was done\n" in declined.err
        assert _until_status(process.url, token, "web:p", "stuck")

        monkeypatch.setattr(sys, "stdin", _Terminal("y\n"))
        resumed = ops("resume", "web:p", "--tool-recovery", "never")
        assert resumed.code == 0, resumed
        assert re.fullmatch(r"resumed web:p: completed \(action act_\w+\)\n", resumed.out)
        assert "fresh attempt budget" in resumed.err
        deadline = time.monotonic() + 20
        while not any(a["text"].startswith("Done:") for a in _answers(process.url, "p", 1)):
            assert time.monotonic() < deadline, _answers(process.url, "p", 1)
            time.sleep(0.05)
        trail = ops("audit", "--lane", "web:p", "--json")
        [event] = [e for e in json.loads(trail.out)["items"] if e["action"] == "resume"]
        assert event["actor"] == "operator:local" and event["details"]["tool_recovery"] == "never"
    finally:
        process.stop()


def test_revoke_and_unrevoke_a_lane(gateway: Gateway, ops: Any) -> None:
    session = gateway.post("held", "/slow 2500")["session"]
    gateway.lane("web:held", "running")

    unconfirmed = ops("revoke", session, "web:held")
    assert unconfirmed.code == 2 and "--yes" in _one_line(unconfirmed.err)
    revoked = ops("revoke", session, "web:held", "--reason", "legal hold", "--yes")
    assert revoked.code == 0, revoked
    assert re.fullmatch(
        rf"revoked {session}/web:held: revoked: legal hold \(lane web:held of session "
        rf"{session}; by operator:alice, [\d-]+ [\d:]+ UTC\)\n",
        revoked.out,
    ), revoked.out
    view = gateway.lane("web:held", "idle")
    assert view["error"]["code"] == "authority_revoked"
    shown = ops("lane", "web:held")
    assert re.search(r"^revoked +legal hold \(lane web:held", shown.out, re.M), shown.out
    assert re.search(r"^actions +unrevoke$", shown.out, re.M)
    table = ops("lanes", "--session", session)
    [row] = [line for line in table.out.splitlines() if "web:held" in line]
    assert "revoked: legal hold" in row
    again = ops("revoke", session, "web:held", "--yes", "--reason", "other")
    assert again.code == 0 and "was revoked already: revoked: legal hold" in again.out

    back = ops("unrevoke", session, "web:held")
    assert back.code == 0
    assert back.out == f"restored {session}/web:held: its authority is back (by operator:alice)\n"
    # --yes too, as revoke takes it: a script pairs them (it was a usage error, an outside probe)
    again = ops("unrevoke", session, "web:held", "--yes")
    assert again.code == 0 and again.out.endswith("was not revoked: nothing changed\n")
    gateway.post("held", "again")
    assert gateway.answers("held", 1)[-1]["text"] == "You said: again"


def test_budget_sets_a_lane_s_own_and_resets_it(gateway: Gateway, ops: Any) -> None:
    session = gateway.post("spend", "hello")["session"]
    gateway.answers("spend", 1)
    name = f"{session}/web:spend"
    raised = ops("budget", name, "2,000,000", "--reason", "a long review")
    assert raised.code == 0, raised
    assert re.fullmatch(
        rf"{session}/web:spend may spend 2000000 tokens in all now \(spent \d+; its profile's "
        r"budget: 1000000\)\n",
        raised.out,
    ), raised.out
    assert "token budget  2000000" in ops("lane", name).out
    again = ops("budget", name, "2000000")
    assert again.code == 0 and "budget was 2000000 tokens already" in again.out
    as_json = json.loads(ops("budget", name, "2000000", "--json").out)
    assert as_json["budget"] == 2000000 and as_json["set_by"] == "operator:alice"
    viewer = ops("budget", name, "5", token=VIEWER)
    assert viewer.code == 1 and "operator" in _one_line(viewer.err)
    reset = ops("budget", name, "--reset")
    assert reset.code == 0
    assert reset.out.startswith(f"{session}/web:spend has its profile's budget again: 1000000")
    assert "token budget  1000000" in ops("lane", name).out
    for bad in ("0", "lots", "1e6", "2000000000"):
        refused = ops("budget", name, bad)
        assert refused.code == 2 and "expected a number of tokens from 1 to" in refused.err


@pytest.mark.parametrize(
    ("url", "sent"),
    [
        ("http://127.0.0.1:8787", True),
        ("http://127.0.0.2:8787", True),
        ("http://[::1]:8787", True),
        ("http://localhost:8787", True),
        ("http://192.0.2.2:8787", False),  # an outside probe's listener got the token
        ("https://ops.example.com", False),
        ("http://[::ffff:192.0.2.2]:8787", False),
    ],
)
def test_the_local_token_file_goes_only_to_this_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str, sent: bool
) -> None:
    monkeypatch.delenv("GATEWAY_OPS_TOKEN", raising=False)
    (tmp_path / "ops-token").write_text("the-local-token\n")
    settings = gateway_settings(store_url=f"sqlite:///{tmp_path}/store.db")
    target = Target(argparse.Namespace(url=url, token=None, config=None), settings)
    assert target.token == ("the-local-token" if sent else None)
    given = Target(argparse.Namespace(url=url, token="mine", config=None), settings)
    assert given.token == "mine"  # a token given outright goes where it is sent


@pytest.mark.parametrize(
    "url",
    [
        "http://user:pw@127.0.0.1:8787",  # the user displaced the token: "refused"
        "http://127.0.0.1:8787/extra/path",  # "no such route"
        "http://127.0.0.1:8787#frag",
        "http://127.0.0.1:8787?x=1",  # "unexpected answer: HTTP 307"
        "http://127.0.0.1:99999",  # "cannot reach": exit 3
        "notaurl",
    ],
)
def test_a_url_that_is_no_gateway_address_is_a_usage_error(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--url", url, "--token", OPERATOR, "lanes"], None) == 2
    line = _one_line(capsys.readouterr().err)
    assert "--url must be the gateway's address like http://127.0.0.1:8787" in line
    assert "pw" not in line  # a password in it is not echoed


def test_a_delivered_reply_s_last_error_reads_as_past() -> None:
    """A dead letter redelivered and delivered listed "delivered ... channel_not_found", as if
    that error were its state."""
    from gateway.ops.cli.reads import _fault

    failed = {"status": "dead", "last_error": "channel_not_found"}
    assert _fault(failed) == "channel_not_found"
    assert _fault({**failed, "status": "delivered"}) == "(before: channel_not_found)"
    assert _fault({"status": "delivered", "last_error": None}) == ""
