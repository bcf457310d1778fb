"""`gateway ask`: the configured model on a durable lane, scripted by default, real over HTTP."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from config import Settings
from gateway.ask import DENIED_AT_THE_TERMINAL, AskFailed, ask
from gateway.channels import gateway_settings
from gateway.cli import main
from gateway.models import ModelConfigError, model_from_settings
from harness_core import PendingApproval, ToolResultMessage
from harness_core.storage import open_repo
from tests.support.fake_llm import FakeLLM
from tests.support.gateway_rig import lane_texts


def test_ask_with_the_default_scripted_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = f"sqlite:///{tmp_path}/gw.db"
    assert main(["ask", "--store", store, "hello", "there"], settings=Settings()) == 0
    assert "You said: hello there" in capsys.readouterr().out
    assert main(["ask", "--store", store, "again"], settings=Settings()) == 0
    assert "You said: again" in capsys.readouterr().out


def test_a_bad_model_setting_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValidationError, match="provider:model_id"):
        Settings(model="gpt-4")  # refused with the settings, before any store is made
    with pytest.raises(ModelConfigError, match="provider:model_id"):
        model_from_settings(Settings(model="nope:x"))
    assert main(["ask", "--store", "memory://", "hi"], settings=Settings(model="nope:x")) == 2
    assert "GATEWAY_MODEL='nope:x'" in capsys.readouterr().err


def stored_bytes(directory: Path) -> bytes:
    return b"".join(p.read_bytes() for p in directory.glob("gw.db*"))


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_ask_a_real_provider_over_http(
    tmp_path: Path, fake: FakeLLM, model_requests: None, provider: str
) -> None:
    base = fake.openai_base_url if provider == "openai" else fake.anthropic_base_url
    settings = Settings(
        store_url=f"sqlite:///{tmp_path}/gw.db",
        model=f"{provider}:test-model",
        model_api_key=SecretStr("sk-test-SECRET-KEY"),
        model_base_url=base,
    )
    fake.reply("Tuesdays at two.", input_tokens=12, output_tokens=4)
    repo = open_repo(settings.store_url)
    out: list[str] = []
    try:
        assert await ask(repo, settings, "cli:ops", "deploy window?", out) == 0
    finally:
        await repo.close()
    assert out == ["Tuesdays at two.", f"({provider}:test-model: 12 tokens in, 4 out)"]
    sent = fake.last_request
    assert sent is not None
    auth = sent.headers.get("authorization", "") + sent.headers.get("x-api-key", "")
    assert "sk-test-SECRET-KEY" in auth  # the key reached the provider ...
    assert b"sk-test-SECRET-KEY" not in stored_bytes(tmp_path)  # ... and never the store


EXAMPLE = "examples.agent"


async def test_ask_gives_its_lane_the_profile_serve_would(
    tmp_path: Path, fake: FakeLLM, model_requests: None
) -> None:
    """`ask` sent no instructions and took no profile: a tool the operator denied was
    offered, and the turn limit and budget were the top level's (an outside probe)."""
    given: dict[str, Any] = {
        "store_url": f"sqlite:///{tmp_path}/gw.db",
        "model": "openai:test-model",
        "model_api_key": "sk-test",
        "model_base_url": fake.openai_base_url,
        "plugin": EXAMPLE,
        "instructions": "You answer deploy questions.",
    }

    async def sent(settings: Settings, question: str) -> tuple[str, list[str]]:
        """The system prompt and the tools the model was sent for `question`."""
        fake.reply("Tuesdays.")
        repo = open_repo(settings.store_url)
        try:
            assert await ask(repo, settings, "cli:ops", question, []) == 0
        finally:
            await repo.close()
        body = fake.last_request.body
        system = [m["content"] for m in body["messages"] if m["role"] == "system"]
        return system[0], [tool["function"]["name"] for tool in body.get("tools", [])]

    denying = gateway_settings(**given, profiles=[{"name": "default", "deny_tools": ["deploy"]}])
    system, offered = await sent(denying, "deploy window?")
    assert system.startswith("You answer deploy questions.")
    assert "Channel: cli" in system and "Thread: ops" in system
    assert offered == ["deploy_window"]  # not the denied `deploy`
    # a route for `ask`'s channel gives its lanes a profile of their own
    routed = gateway_settings(
        **given,
        profiles=[{"name": "terminal", "instructions": "You are at a terminal."}],
        routes=[{"channel": "cli", "session": "cli", "profile": "terminal"}],
    )
    system, offered = await sent(routed, "and now?")
    assert system.startswith("You are at a terminal.")
    assert offered == ["deploy_window", "deploy"]


ROOT = Path(__file__).resolve().parents[2]


async def _ask(
    store: str,
    question: str,
    decide: Any = None,
    lane: str = "cli:ship",
    notes: list[str] | None = None,
) -> tuple[int | str, list[str]]:
    """`ask` with the example plugin: (0 or the AskFailed line, what it printed).

    `notes`: what goes to stderr (None: it is printed with the rest).
    """
    repo = open_repo(store)
    out: list[str] = []
    try:
        try:
            status: int | str = await ask(
                repo, Settings(plugin=EXAMPLE), lane, question, out, decide, notes=notes
            )
        except AskFailed as failed:
            status = str(failed)
    finally:
        await repo.close()
    return status, out


async def _tool_results(store: str, lane: str) -> list[str]:
    repo = open_repo(store)
    try:
        return await lane_texts(repo, "cli", lane, ToolResultMessage)
    finally:
        await repo.close()


async def test_ask_runs_the_plugins_tools(tmp_path: Path) -> None:
    status, out = await _ask(f"sqlite:///{tmp_path}/gw.db", "when is the deploy window?")
    assert status == 0
    assert out[0] == "Deploys are open Tuesday to Thursday, 10:00-16:00 UTC."


async def test_an_approval_without_a_terminal_stops_and_the_lane_keeps_waiting(
    tmp_path: Path,
) -> None:
    store = f"sqlite:///{tmp_path}/gw.db"
    status, out = await _ask(store, "deploy api")
    assert status == (
        'the run on lane cli:ship waits for approval of deploy {"service": "api"}: nobody here '
        "can decide (input is not a terminal); `gateway ask --lane cli:ship` in a terminal asks "
        "again, and the lane keeps waiting until then"
    )
    assert out == []
    status, _ = await _ask(store, "anything else?")  # still waiting: nothing new starts
    assert isinstance(status, str) and "waits for approval of deploy" in status
    # and says so: it read as asked (an outside probe)
    assert 'deploy {"service": "api"}: this question was not taken; nobody here' in status
    assert await _tool_results(store, "cli:ship") == []  # the deploy never ran

    asked: list[str] = []

    async def yes(call: PendingApproval) -> bool:
        asked.append(f"{call.tool_name} {dict(call.args)}")
        return True

    notes: list[str] = []
    status, out = await _ask(store, "and now?", yes, notes=notes)
    assert status == 0
    assert asked == ["deploy {'service': 'api'}"]
    # stdout is the question's answer alone (`x=$(gateway ask ...)`); the run before, beside it
    assert out == ["You said: and now?"]
    assert notes[0] == "(the run before waited for approval: decided first)"
    assert notes[1].startswith("api deployed (request ")
    [result] = await _tool_results(store, "cli:ship")  # ran once, after the approval
    assert result == notes[1]


async def test_ask_without_a_question_only_continues_what_the_lane_left_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GATEWAY_COMMAND", raising=False)
    store = f"sqlite:///{tmp_path}/gw.db"
    status, _ = await _ask(store, "deploy api")
    assert isinstance(status, str) and "`gateway ask --lane cli:ship` in a terminal" in status

    async def yes(call: PendingApproval) -> bool:
        return True

    status, out = await _ask(store, "", yes)  # what that hint runs, at a terminal
    assert status == 0
    assert out[0] == "(the run before waited for approval: decided)"
    assert out[1].startswith("api deployed (request ")
    assert len(out) == 2  # nothing new was asked
    status, out = await _ask(store, "")
    assert status == (
        "nothing waits on lane cli:ship: write the question (`gateway ask --lane cli:ship TEXT...`)"
    )
    assert out == []


@pytest.mark.parametrize(
    ("typed", "named"),
    [
        (None, "gateway"),
        ("scripts/run", "scripts/run"),
        ("./scripts/run", "./scripts/run"),
        ("  ", "gateway"),
        ("scripts/run\nrm -rf /", "gateway"),  # a hint is one line, whatever the variable holds
    ],
)
async def test_hints_name_the_command_as_it_was_typed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, typed: str | None, named: str
) -> None:
    if typed is None:
        monkeypatch.delenv("GATEWAY_COMMAND", raising=False)
    else:
        monkeypatch.setenv("GATEWAY_COMMAND", typed)
    status, _ = await _ask(f"sqlite:///{tmp_path}/gw.db", "deploy api")
    assert isinstance(status, str) and f"`{named} ask --lane cli:ship` in a terminal" in status


def test_the_command_line_forms_of_ask(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATEWAY_COMMAND", "scripts/run")
    store = f"sqlite:///{tmp_path}/gw.db"
    assert main(["ask", "--store", store, "--lane", "cli:x"], settings=Settings()) == 2
    assert capsys.readouterr().err == (
        "gateway: nothing waits on lane cli:x: write the question "
        "(`scripts/run ask --lane cli:x TEXT...`)\n"
    )
    assert main(["ask", "--store", store, "  "], settings=Settings()) == 2
    assert "the question is empty" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["ask", "--help"], settings=Settings())
    assert capsys.readouterr().out.startswith("usage: scripts/run ask ")


async def test_a_call_denied_at_the_terminal_does_not_run(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/gw.db"

    async def no(call: PendingApproval) -> bool:
        return False

    status, out = await _ask(store, "deploy api", no)
    assert status == 0
    assert DENIED_AT_THE_TERMINAL in out[0]
    [result] = await _tool_results(store, "cli:ship")
    assert "deployed" not in result and DENIED_AT_THE_TERMINAL in result


def _at_the_prompt(tmp_path: Path, then: Any) -> tuple[int, str, str]:
    """`gateway ask "deploy web"` on a pty: `then(proc, terminal)` once it asks y/N.

    Returns the exit status, what it printed on stdout, and what the terminal showed.
    """
    store = f"sqlite:///{tmp_path}/gw.db"
    env = {**os.environ, "GATEWAY_PLUGIN": EXAMPLE, "GATEWAY_STORE_URL": store}
    command = [sys.executable, "-m", "gateway", "ask", "--lane", "cli:ship", "deploy web"]
    terminal, tty = pty.openpty()
    with subprocess.Popen(
        command, cwd=ROOT, env=env, stdin=tty, stdout=subprocess.PIPE, stderr=tty
    ) as proc:
        os.close(tty)
        shown = b""
        deadline = time.monotonic() + 30
        while b"approve? [y/N] " not in shown:
            assert time.monotonic() < deadline, shown
            ready, _, _ = select.select([terminal], [], [], 0.5)
            if ready:
                shown += os.read(terminal, 4096)
        assert b'deploy {"service": "web"}' in shown
        then(proc, terminal)
        printed, _ = proc.communicate(timeout=30)
        while select.select([terminal], [], [], 0.2)[0]:
            try:
                shown += os.read(terminal, 4096)
            except OSError:  # the other side is closed: all was read
                break
    os.close(terminal)
    return proc.returncode, printed.decode(), shown.decode()


def test_gateway_ask_puts_the_approval_to_the_person_at_the_terminal(tmp_path: Path) -> None:
    status, printed, _ = _at_the_prompt(tmp_path, lambda _, terminal: os.write(terminal, b"y\n"))
    assert status == 0, printed
    assert printed.splitlines()[0].startswith("web deployed (request ")


def test_an_answer_that_is_neither_yes_nor_no_is_asked_again(tmp_path: Path) -> None:
    """ "yes please" was a denial recorded for good."""
    status, printed, shown = _at_the_prompt(
        tmp_path, lambda _, terminal: os.write(terminal, b"yes please\ny\n")
    )
    assert status == 0, shown
    assert "please answer y (approve) or n (deny): " in shown
    assert printed.splitlines()[0].startswith("web deployed (request ")


async def test_the_end_of_input_at_the_prompt_decides_nothing(tmp_path: Path) -> None:
    """Ctrl-D was a denial recorded for good."""
    status, printed, shown = _at_the_prompt(
        tmp_path, lambda _, terminal: os.write(terminal, b"\x04")
    )
    assert status == 1 and printed == "", shown
    assert (
        "gateway: no answer: nothing was decided; the run on lane cli:ship keeps waiting" in shown
    )
    assert await _tool_results(f"sqlite:///{tmp_path}/gw.db", "cli:ship") == []


async def test_ctrl_c_at_the_prompt_decides_nothing_and_the_lane_keeps_waiting(
    tmp_path: Path,
) -> None:
    status, printed, shown = _at_the_prompt(
        tmp_path, lambda proc, _: proc.send_signal(signal.SIGINT)
    )
    assert status == 130, shown
    assert printed == ""
    assert (
        "gateway: interrupted: nothing was decided; the run on lane cli:ship keeps waiting for "
        "approval (`gateway ask --lane cli:ship` asks again)"
    ) in shown
    assert await _tool_results(f"sqlite:///{tmp_path}/gw.db", "cli:ship") == []
    later, _ = await _ask(f"sqlite:///{tmp_path}/gw.db", "and now?")
    assert isinstance(later, str) and "waits for approval of deploy" in later


def _desk_config(tmp_path: Path, command: str) -> Path:
    """The MCP walkthrough's configuration, its desk kept under `tmp_path`."""
    config = tmp_path / "gateway.toml"
    config.write_text(
        f'plugin = "{ROOT / "examples/mcp/agent.py"}"\n'
        f'store_url = "sqlite:///{tmp_path}/gw.db"\n'
        "[[mcp.servers]]\n"
        'name = "tickets"\n'
        f'command = "{command}"\n'
        f'args = ["{ROOT / "examples/mcp/server.py"}"]\n'
        f'env = {{ TICKETS_FILE = "{tmp_path}/tickets.json" }}\n'
        "trusted = true\n"
    )
    return config


def test_ask_offers_the_configured_mcp_servers_tools(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _desk_config(tmp_path, sys.executable)
    assert main(["ask", "--config", str(config), "create printer on fire"]) == 0
    assert "Created ticket #1: printer on fire" in capsys.readouterr().out
    assert '"printer on fire"' in (tmp_path / "tickets.json").read_text()  # the server made it
    # the destructive one waits for a person, as in `serve`; without a terminal nobody decides
    assert main(["ask", "--config", str(config), "delete 1"]) == 1
    assert "waits for approval of tickets.delete_ticket" in capsys.readouterr().err
    assert '"printer on fire"' in (tmp_path / "tickets.json").read_text()


def test_ask_names_an_mcp_server_that_did_not_come_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _desk_config(tmp_path, "/nonexistent/python")
    assert main(["ask", "--config", str(config), "hello"]) == 0  # the rest of the agent works
    said = capsys.readouterr()
    assert "You said: hello" in said.out
    assert "(the MCP server tickets did not come up: cannot start '/nonexistent/python'" in said.err
    assert "its tools are not offered)" in said.err


def test_ask_says_what_a_server_that_stopped_printed(tmp_path: Path) -> None:
    """It said "MCPError: Connection closed" after a bare "mcp.server_down" line: the reason
    (a module not installed) was only on the server's stderr, thrown away."""
    (tmp_path / "crm.py").write_text("import crm_mcp_not_installed\n")
    config = _desk_config(tmp_path, sys.executable)
    config.write_text(
        config.read_text().replace(str(ROOT / "examples/mcp/server.py"), str(tmp_path / "crm.py"))
    )
    # as a person runs it: Python's last-resort handler printed the bare event name
    ran = subprocess.run(
        [sys.executable, "-m", "gateway", "ask", "--config", str(config), "hello"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    assert "You said: hello" in ran.stdout
    [line, tokens] = ran.stderr.splitlines()
    assert tokens.startswith("(scripted:") and "tokens in" in tokens  # after the answer
    assert line.startswith(
        "(the MCP server tickets did not come up: the connection closed (the server exited or "
        "closed its output); its stderr ended with: Traceback (most recent call last): | "
    )
    assert line.endswith(
        "ModuleNotFoundError: No module named 'crm_mcp_not_installed'; its tools are not offered)"
    )
