"""Every command README.md shows is run as a newcomer types it, on a fresh copy of the repository.

The README's commands are collected mechanically: every line of a ``sh`` block (with ``$``
prompts, only the prompted lines; continuation lines joined, trailing ``  # comments`` dropped)
and every inline code span that starts like a command (``scripts/``, ``.venv/bin/``, ``curl``,
``VAR=value scripts/run``...). Each one must be in `STEPS` (run here, with what it must show) or
in `NOT_HERE` (with the test or script that runs it instead), and nothing else may be: a command
added to the README without a check fails `test_every_readme_command_is_checked`.

The copy is what a clone holds (``git ls-files``: tracked and new files, nothing ignored), with
no ``.venv``: the first ``scripts/run`` installs the project as a newcomer's does. The commands
run with ``bash -c`` in that copy, with ``.venv/bin`` kept off the PATH and no ``GATEWAY_*``
variable but ``GATEWAY_PORT`` (a free port: the README's ``8787`` in a command becomes it). A
command that needs a Slack workspace or a provider gets the local fake instead through one more
variable (``GATEWAY_SLACK_API_URL``, ``GATEWAY_MODEL_BASE_URL``), and is otherwise as typed.
The benchmarks run with smaller sizes here (`BENCHES`; their full runs print the README's figures).
"""

from __future__ import annotations

import asyncio
import json
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.support.fake_llm import FakeLLM, allow_model_requests
from tests.support.fake_slack import FakeSlack
from tests.support.redis_server import free_port

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
README_PORT = "8787"
INSTALL_SECONDS = 420.0  # the first scripts/run installs the project (about a minute here)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(INSTALL_SECONDS + 180)]


# --- the README's commands ------------------------------------------------------------------

_FENCE = re.compile(r"^(?P<indent>\s*)```(?P<info>\S*)\s*$")
_COMMENT = re.compile(r"\s{2,}#.*$")
_SHELL = ("sh", "bash", "shell", "console")
_COMMAND = re.compile(
    r"^(?:[A-Z][A-Z0-9_]*=\S+\s+)*"
    r"(?:scripts/|\.venv/bin/|bench/\.peer-venv/|python3?\s|curl\s|strace\s|pip\s|apt-get\s"
    r"|source\s|gateway\s+[a-z][a-z-]*\s+\S)"
)
_SYNOPSIS = re.compile(r"<\w[^>]*>")  # `scripts/run <command>`: a form, not a command


def readme_commands(text: str) -> list[str]:
    """Every command `text` shows, in order, as one line each (see the module docstring)."""
    lines = text.splitlines()
    found: list[tuple[int, str]] = []
    prose: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            prose.append((i, lines[i]))
            i += 1
            continue
        indent, info, start = len(fence["indent"]), fence["info"], i + 1
        i += 1
        while i < len(lines) and _FENCE.match(lines[i]) is None:
            i += 1
        if info in _SHELL:
            found.extend(_block_commands(start, [line[indent:] for line in lines[start:i]]))
        i += 1
    numbers = [n for n, _ in prose]
    joined = "\n".join(line for _, line in prose)
    for span in re.finditer(r"`([^`]+)`", joined):
        command = " ".join(span[1].split())
        if _COMMAND.match(command) and _SYNOPSIS.search(command) is None:
            found.append((numbers[joined.count("\n", 0, span.start())], command))
    return [command for _, command in sorted(found)]


def _block_commands(start: int, body: list[str]) -> Iterator[tuple[int, str]]:
    prompted = any(line.startswith("$ ") for line in body)
    parts: list[str] = []
    first = start
    for number, raw in enumerate(body, start):
        line = _COMMENT.sub("", raw).rstrip()
        if not parts:
            if prompted:
                if not line.startswith("$ "):
                    continue  # what the command printed
                line = line[2:]
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            first = number
        parts.append(line.removesuffix("\\").strip())
        if not line.endswith("\\"):
            yield first, " ".join(parts)
            parts = []


# --- what each command must do -------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """A README command run here, and what it must show.

    Attributes:
        status: its exit status (a served command: the status after Ctrl-C).
        shows: text (regular expressions) its output must hold, stdout and stderr together.
        served: it is the service: started, told apart by its banner, stopped with Ctrl-C.
    """

    status: int = 0
    shows: tuple[str, ...] = ()
    served: bool = False


MCP_POST = (
    "curl -s -X POST http://127.0.0.1:8787/web/threads/t1/messages -H 'content-type: "
    'application/json\' -d \'{{"space": "desk", "text": "{text}"}}\' >/dev/null'
)
"""The MCP walkthrough's messages: to thread t1 of the web space `desk`."""

SERVED = Step(served=True, shows=(r"gateway: serving on http://127\.0\.0\.1:\d+",))

STEPS: dict[str, Step] = {
    "scripts/run": SERVED,
    "curl -s -X POST http://127.0.0.1:8787/web/threads/hello/messages -H 'content-type: "
    'application/json\' -d \'{"text": "hello"}\'': Step(shows=(r'"lane":"web:hello"',)),
    "curl -s http://127.0.0.1:8787/web/threads/hello": Step(shows=(r'"text":"hello"',)),
    "scripts/run ops lanes --stuck": Step(),
    "scripts/run ops timeline web:hello": Step(shows=(r"You said: hello",)),
    "scripts/run ops usage web:hello": Step(
        shows=(r"total: \d+ in / \d+ out, \d+ tokens", r"budget: none \(GATEWAY_TOKEN_BUDGET")
    ),
    # the fresh gateway sets no token budget: there is none to raise, and it says so
    'scripts/run ops budget web:hello 2000000 --reason "a long review"': Step(
        status=1, shows=(r"has no token budget to set: give its profile a token_budget",)
    ),
    # web:card names a reader's stuck lane: on this fresh store there is none, and it says so
    "scripts/run ops resume web:card --tool-recovery never": Step(
        status=1, shows=(r"no lane 'web:card' \(scripts/run ops lanes lists them",)
    ),
    # the plugin walkthrough's thread: not on this store, and it says so before asking anything
    "scripts/run ops approve web:ship --all": Step(
        status=1, shows=(r"no lane 'web:ship' \(scripts/run ops lanes lists them",)
    ),
    "scripts/run ops deliveries": Step(),
    'scripts/run ops revoke web-default web:hello --reason "customer offboarded" --yes': Step(
        shows=(r"revoked web-default/web:hello: revoked: customer offboarded",)
    ),
    "scripts/run ops unrevoke web-default web:hello": Step(
        shows=(r"restored web-default/web:hello: its authority is back",)
    ),
    "scripts/run ops mcp": Step(shows=(r"no MCP servers configured",)),
    "scripts/run ops --help": Step(shows=(r"usage: scripts/run ops",)),
    "scripts/run store list": Step(shows=(r"web-default",)),
    # options before the command were taken for the service's ("unrecognized arguments")
    "scripts/run --store sqlite:///.gateway/gateway.db store list": Step(shows=(r"web-default",)),
    "scripts/run store show web-default": Step(shows=(r"lane web:hello ",)),
    "scripts/run store check": Step(shows=(r"checked \d+ sessions?, \d+ items: clean",)),
    "scripts/run --help": Step(shows=(r"usage: scripts/run ",)),
    "scripts/run demo": Step(shows=(r"inspect it again: scripts/run store show ",)),
    "scripts/run --config gateway.toml": SERVED,
    ".venv/bin/python -m gateway.examples .": Step(),
    "source .venv/bin/activate": Step(),
    ".venv/bin/python": Step(),
    ".venv/bin/pip install -e '.[otlp]'": Step(),
    'scripts/run ask "what is our deploy window?"': Step(
        shows=(r"You said: what is our deploy window\?",)
    ),
    "GATEWAY_MODEL=anthropic:claude-sonnet-5-5 GATEWAY_MODEL_API_KEY=sk-ant-... scripts/run ask "
    '--lane cli:ops "what is our deploy window?"': Step(shows=(r"Tuesdays, 14:00 to 16:00 UTC",)),
    'scripts/run ask --lane cli:ops "hello"': Step(shows=(r"You said: hello",)),
    'echo "hi from a pipe" | scripts/run ask --lane cli:ops -': Step(
        shows=(r"You said: hi from a pipe",)
    ),
    # nothing waits on cli:ops here (the approval walkthrough continues cli:default on a pty)
    "scripts/run ask --lane cli:ops": Step(status=2, shows=(r"nothing waits on lane cli:ops",)),
    'GATEWAY_PLUGIN=examples.agent scripts/run ask "deploy api"': Step(
        status=1,
        shows=(r"`scripts/run ask --lane cli:default` in a terminal asks again",),
    ),
    "GATEWAY_PLUGIN=examples.agent scripts/run": SERVED,
    "curl -s -X POST http://127.0.0.1:8787/web/threads/ship/messages -H 'content-type: "
    'application/json\' -d \'{"text": "when is the deploy window?"}\' >/dev/null': Step(),
    "curl -s -X POST http://127.0.0.1:8787/web/threads/ship/messages -H 'content-type: "
    'application/json\' -d \'{"text": "deploy api"}\' >/dev/null': Step(),
    "scripts/run ops approve web:ship --all --yes": Step(shows=(r"approved web:ship: completed",)),
    "GATEWAY_SLACK_BOT_TOKEN=xoxb-... GATEWAY_SLACK_APP_TOKEN=xapp-... "
    'GATEWAY_SLACK_APPROVERS=\'{"C0123ABCD": ["U0456EFGH", "S0789IJKL"], "*": ["U0999MNOP"]}\' '
    "scripts/run": SERVED,
    "scripts/run --config examples/mcp/gateway.toml": SERVED,
    MCP_POST.format(text="create printer on fire"): Step(),
    MCP_POST.format(text="delete 1"): Step(),
    "scripts/run ops mcp --tools": Step(shows=(r"tickets +stdio +python +ready", r"delete_ticket")),
    "scripts/run ops approve desk/web:t1 --all --yes": Step(shows=(r"approved web:t1: completed",)),
    "GATEWAY_EMAIL_ADDRESS=agent@example.com GATEWAY_EMAIL_PASSWORD='app-password' "
    "GATEWAY_EMAIL_IMAP_HOST=imap.example.com GATEWAY_EMAIL_SMTP_HOST=smtp.example.com "
    "scripts/run": SERVED,
}


@dataclass(frozen=True)
class Bench:
    """A benchmark command of the README, run here at a smaller size (or by another test)."""

    here: str | None = None
    """The command run here (the README's, with smaller sizes), or None: `by` runs it."""
    shows: str = ""
    by: str = ""
    """The test that runs it instead (a smoke test of that benchmark)."""


BENCHES: dict[str, Bench] = {
    ".venv/bin/python bench/live_bench.py --messages 300": Bench(
        by="tests/bench/test_live_bench_smoke.py"
    ),
    ".venv/bin/python bench/email_latency.py --mails 30": Bench(
        ".venv/bin/python bench/email_latency.py --mails 2", r"email: 2 mails"
    ),
    ".venv/bin/python bench/email_latency.py --mails 2": Bench(
        ".venv/bin/python bench/email_latency.py --mails 2", r"email: 2 mails"
    ),
    ".venv/bin/python -m bench.kill_soak --kills 200": Bench(
        ".venv/bin/python -m bench.kill_soak --kills 2 --backends sqlite", r"sqlite \| 2 \|"
    ),
    ".venv/bin/python -m bench.store_bench": Bench(
        ".venv/bin/python -m bench.store_bench --quick --backends sqlite --no-shapes",
        r"sqlite",
    ),
    ".venv/bin/python -m bench.latency_probe": Bench(
        ".venv/bin/python -m bench.latency_probe", r"executor round trip"
    ),
    ".venv/bin/python -m bench.harness_bench": Bench(
        ".venv/bin/python -m bench.harness_bench --quick --backends memory", r"memory"
    ),
    ".venv/bin/python bench/harness_bench.py --quick": Bench(
        ".venv/bin/python bench/harness_bench.py --quick --backends sqlite", r"sqlite"
    ),
    ".venv/bin/python bench/lane_restore_bench.py --lanes 1000,10000,100000 --trials 5 "
    "--log-cache /tmp/lane-logs": Bench(by="tests/bench/test_lane_restore_bench_smoke.py"),
    ".venv/bin/python bench/vs_langgraph.py": Bench(by="tests/bench/test_vs_langgraph_smoke.py"),
    'python bench/vs_langgraph.py --child ours:tp --params \'{"db": "/tmp/tp.db", '
    '"threads": 200, "turns": 5, "mode": "seq"}\' --result /tmp/tp.json': Bench(
        '.venv/bin/python bench/vs_langgraph.py --child ours:tp --params \'{"db": "{tmp}/tp.db"'
        ', "threads": 5, "turns": 2, "mode": "seq"}\' --result {tmp}/tp.json',
        "",
    ),
    "strace -f -w -c -e trace=fsync,fdatasync .venv/bin/python bench/vs_langgraph.py --child "
    'ours:growth --params \'{"db":"/tmp/st.db","hmax":100,"keep":false}\' --result '
    "/tmp/st.json": Bench(
        ".venv/bin/python bench/vs_langgraph.py --child ours:growth --params "
        '\'{"db":"{tmp}/st.db","hmax":10,"keep":false}\' --result {tmp}/st.json',
        "",
    ),
    ".venv/bin/python bench/gateway_bench.py": Bench(by="tests/bench/test_gateway_bench_smoke.py"),
    ".venv/bin/python bench/redis_calls.py": Bench(by="tests/bench/test_redis_calls_smoke.py"),
    "GATEWAY_LINGER_SECONDS=0 .venv/bin/python bench/gateway_bench.py --only "
    "sqlite,redis1,redis2": Bench(by="tests/bench/test_gateway_bench_smoke.py"),
    ".venv/bin/python bench/vs_langgraph.py --durability full": Bench(
        by="tests/bench/test_vs_langgraph_smoke.py"
    ),
    ".venv/bin/python bench/resume_stages.py": Bench(by="tests/bench/test_resume_stages_smoke.py"),
    ".venv/bin/python bench/decode_options.py": Bench(
        by="tests/bench/test_decode_options_smoke.py"
    ),
    ".venv/bin/python bench/redis_command_cost.py": Bench(
        by="tests/bench/test_redis_command_cost_smoke.py"
    ),
    ".venv/bin/python bench/mcp_stall.py": Bench(by="tests/bench/test_mcp_stall_smoke.py"),
    ".venv/bin/python bench/prompt_instructions.py --profile 40": Bench(
        by="tests/bench/test_prompt_instructions_smoke.py"
    ),
    ".venv/bin/python bench/prompt_instructions.py --instructions": Bench(
        by="tests/bench/test_prompt_instructions_smoke.py"
    ),
    ".venv/bin/python bench/prompt_instructions.py --collector gateway": Bench(
        by="tests/bench/test_prompt_instructions_smoke.py"
    ),
    ".venv/bin/python bench/turn_instructions.py --turns 100 --instructions": Bench(
        by="tests/bench/test_turn_instructions_smoke.py"
    ),
    ".venv/bin/python bench/lane_restore_bench.py --lanes 1000,100000 --trials 3 "
    "--log-cache /tmp/lane-logs": Bench(by="tests/bench/test_lane_restore_bench_smoke.py"),
    ".venv/bin/python bench/harness_bench.py --backends redis --prompts 800 --histories 10 "
    "--trials 1 --restore 5x10x1": Bench(
        ".venv/bin/python bench/harness_bench.py --quick --backends memory --histories 10 "
        "--trials 1 --restore 5x10x1",
        r"memory",
    ),
    ".venv/bin/python bench/gateway_bench.py --only redis1 --messages 3000 --rate 20 "
    "--seconds 8": Bench(by="tests/bench/test_gateway_bench_smoke.py"),
    ".venv/bin/python bench/gateway_bench.py --only redis1 --messages 3000 --seconds 8": Bench(
        by="tests/bench/test_gateway_bench_smoke.py"
    ),
    ".venv/bin/python bench/gateway_bench.py --only sqlite,redis1 --messages 3000 "
    "--seconds 8": Bench(by="tests/bench/test_gateway_bench_smoke.py"),
    ".venv/bin/python bench/gateway_bench.py --only takeover --lease 3 --kills 3": Bench(
        by="tests/bench/test_gateway_bench_smoke.py"
    ),
}

NOT_HERE: dict[str, str] = {
    "scripts/test": "CI runs it: .ci/run ends with `exec scripts/test`, and this test is in it",
    "scripts/test -k sqlite -x": "scripts/test hands its arguments to pytest (checked below)",
    "apt-get install -y redis-server dovecot-imapd chromium prometheus valgrind": (
        ".ci/run installs what is missing"
    ),
    "python3 -m venv bench/.peer-venv && bench/.peer-venv/bin/pip install -r "
    "bench/vs_langgraph.requirements.txt": "installs the peer (LangGraph) for a manual "
    "benchmark; tests/bench/test_vs_langgraph_smoke.py runs the benchmark without it",
}


def test_every_readme_command_is_checked() -> None:
    commands = readme_commands(README.read_text())
    checked = set(STEPS) | set(BENCHES) | set(NOT_HERE)
    unchecked = sorted(set(commands) - checked)
    assert not unchecked, f"README commands with no check here: {unchecked}"
    stale = sorted(checked - set(commands))
    assert not stale, f"checks of commands README no longer shows: {stale}"


def test_the_commands_run_elsewhere_are_run_there() -> None:
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == "exec scripts/test"
    assert "apt-get install -y" in "\n".join(ci)
    runs = [
        line
        for line in (ROOT / "scripts" / "test").read_text().splitlines()
        if line.startswith(".venv/bin/python -m pytest ")
    ]
    assert [run.split("--phase ")[1].split()[0] for run in runs] == ["shared", "alone"]
    assert all('"$@"' in run for run in runs), runs
    for bench in BENCHES.values():
        if bench.by:
            assert (ROOT / bench.by).is_file(), bench.by


def test_readme_commands_are_recognised() -> None:
    text = """
Run `scripts/run demo` or `gateway serve`; `scripts/run <command>` is a form.
```sh
$ curl -s http://x \\
       -H 'a: b'
{"printed": 1}
scripts/run ops lanes   # a comment
```
```sh
# a comment line
GATEWAY_X=1 \\
    scripts/run
```
    """
    assert readme_commands(text) == [
        "scripts/run demo",
        "curl -s http://x -H 'a: b'",
        "GATEWAY_X=1 scripts/run",
    ]


# --- running them on a fresh copy ------------------------------------------------------------


@dataclass
class Copy:
    """A fresh copy of the repository and the environment its commands run in."""

    path: Path
    port: int
    env: dict[str, str]
    ran: list[str] = field(default_factory=list)

    def command(self, readme: str) -> str:
        """The README's command as run here: its port is this copy's."""
        assert readme in STEPS, f"not a README command with a check: {readme!r}"
        self.ran.append(readme)
        return readme.replace(f"127.0.0.1:{README_PORT}", f"127.0.0.1:{self.port}")


def _fresh_env(port: int) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("GATEWAY_") and key not in ("VIRTUAL_ENV", "PYTHONPATH")
    }
    path = [p for p in env.get("PATH", "").split(os.pathsep) if not p.endswith(".venv/bin")]
    env["PATH"] = os.pathsep.join(path)
    env["GATEWAY_PORT"] = str(port)
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Copy:
    """The repository's files as a clone has them, in a new directory, without a venv."""
    target = tmp_path_factory.mktemp("clone") / "durable-gateway"
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (entry.decode() for entry in listed)):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    port = free_port()
    return Copy(target, port, _fresh_env(port))


@dataclass(frozen=True)
class Ran:
    status: int
    output: str


async def _run(copy: Copy, readme: str, *, env: Mapping[str, str] | None = None) -> Ran:
    """Run a README command in the copy and check it against its `Step`."""
    step = STEPS[readme]
    assert not step.served
    proc = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        copy.command(readme),
        cwd=copy.path,
        env={**copy.env, **(env or {})},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), INSTALL_SECONDS)
    finally:
        if proc.returncode is None:
            proc.kill()
    ran = Ran(proc.returncode if proc.returncode is not None else -1, out.decode())
    _check(readme, step, ran)
    return ran


def _check(readme: str, step: Step, ran: Ran) -> None:
    where = f"{readme!r} printed:\n{ran.output}"
    assert ran.status == step.status, where
    for pattern in step.shows:
        assert re.search(pattern, ran.output), f"{pattern!r} not in {where}"
    assert "Traceback" not in ran.output, where


@dataclass
class Served:
    """A served README command: its process group and its output so far."""

    proc: asyncio.subprocess.Process
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
async def serve(fresh: Copy, tmp_path: Path) -> AsyncIterator[object]:
    started: list[tuple[str, Served]] = []

    async def start(readme: str, env: Mapping[str, str] | None = None) -> Served:
        assert STEPS[readme].served
        log = tmp_path / f"served-{len(started)}.log"
        with log.open("wb") as sink:
            proc = await asyncio.create_subprocess_exec(
                "bash",
                "-c",
                fresh.command(readme),
                cwd=fresh.path,
                env={**fresh.env, **(env or {})},
                stdin=asyncio.subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: Ctrl-C reaches what it runs, as a tty's
            )
        served = Served(proc, log)
        started.append((readme, served))
        deadline = time.monotonic() + INSTALL_SECONDS
        while "gateway: serving on" not in served.output():
            assert proc.returncode is None, f"{readme!r} ended:\n{served.output()}"
            assert time.monotonic() < deadline, served.output()
            await asyncio.sleep(0.1)
        return served

    yield start
    for readme, served in started:
        await _ctrl_c(readme, served)


async def _ctrl_c(readme: str, served: Served) -> None:
    """Ctrl-C at the terminal: the service drains and stops, and nothing it printed is a trace."""
    if served.proc.returncode is None:
        os.killpg(served.proc.pid, signal.SIGINT)
        try:
            await asyncio.wait_for(served.proc.wait(), 60)
        finally:
            if served.proc.returncode is None:
                os.killpg(served.proc.pid, signal.SIGKILL)
    _check(readme, STEPS[readme], Ran(served.proc.returncode or 0, served.output()))
    for line in served.output().splitlines():
        if line.startswith("{"):
            json.loads(line)  # a log line is one JSON object


async def _until(url: str, pattern: str, seconds: float = 30.0) -> str:
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient() as http:
        while True:
            text = (await http.get(url)).text
            if re.search(pattern, text) or time.monotonic() > deadline:
                assert re.search(pattern, text), f"{pattern!r} never in {url}: {text}"
                return text
            await asyncio.sleep(0.1)


async def test_run_it_talk_to_it_and_operate_it(fresh: Copy, serve: object) -> None:
    start = serve
    assert callable(start)
    served = await start("scripts/run")  # the first run installs the project into .venv
    assert (fresh.path / ".venv" / "bin" / "gateway").exists()
    await _run(
        fresh,
        "curl -s -X POST http://127.0.0.1:8787/web/threads/hello/messages -H 'content-type: "
        'application/json\' -d \'{"text": "hello"}\'',
    )
    thread = f"http://127.0.0.1:{fresh.port}/web/threads/hello"
    await _until(thread, "You said: hello")
    await _run(fresh, "curl -s http://127.0.0.1:8787/web/threads/hello")
    for command in (
        "scripts/run ops lanes --stuck",
        "scripts/run ops timeline web:hello",
        "scripts/run ops usage web:hello",
        'scripts/run ops budget web:hello 2000000 --reason "a long review"',
        "scripts/run ops resume web:card --tool-recovery never",
        "scripts/run ops approve web:ship --all",
        "scripts/run ops deliveries",
        'scripts/run ops revoke web-default web:hello --reason "customer offboarded" --yes',
        "scripts/run ops unrevoke web-default web:hello",
        "scripts/run ops mcp",
        "scripts/run ops --help",
        "scripts/run store list",
        "scripts/run --store sqlite:///.gateway/gateway.db store list",
        "scripts/run store show web-default",
        "scripts/run store check",
        "scripts/run --help",
    ):
        await _run(fresh, command)
    await _ctrl_c("scripts/run", served)
    assert "Ctrl-C drains and stops" in served.output()


async def test_configure_it(fresh: Copy, serve: object) -> None:
    start = serve
    assert callable(start)
    shutil.copy(fresh.path / "gateway.example.toml", fresh.path / "gateway.toml")
    await start("scripts/run --config gateway.toml")
    examples = {name: (fresh.path / name).read_text() for name in (".env.example",)}
    examples["gateway.example.toml"] = (fresh.path / "gateway.example.toml").read_text()
    await _run(fresh, ".venv/bin/python -m gateway.examples .")
    for name, before in examples.items():
        assert (fresh.path / name).read_text() == before, f"{name} is not what settings generate"
    ran = await _run(fresh, "source .venv/bin/activate")
    assert ran.output == ""
    on_path = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        "source .venv/bin/activate && gateway --help",
        cwd=fresh.path,
        env=fresh.env,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await on_path.communicate()
    assert on_path.returncode == 0 and out.decode().startswith("usage: gateway ")
    await _run(fresh, ".venv/bin/pip install -e '.[otlp]'")


async def test_the_runtime_example_runs_as_pasted(fresh: Copy) -> None:
    text = README.read_text()
    [example] = re.findall(r"runs as it is: `\.venv/bin/python`.*?```python\n(.*?)```", text, re.S)
    fresh.ran.append(".venv/bin/python")
    proc = await asyncio.create_subprocess_exec(
        ".venv/bin/python",
        cwd=fresh.path,
        env=fresh.env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(example.encode()), 120)
    assert proc.returncode == 0, out.decode()
    assert "Traceback" not in out.decode()


async def test_ask_and_the_demo(fresh: Copy) -> None:
    await _run(fresh, 'scripts/run ask "what is our deploy window?"')
    async with FakeLLM() as fake:
        fake.reply(text="Tuesdays, 14:00 to 16:00 UTC.", input_tokens=20, output_tokens=9)
        with allow_model_requests():
            await _run(
                fresh,
                "GATEWAY_MODEL=anthropic:claude-sonnet-5-5 GATEWAY_MODEL_API_KEY=sk-ant-... "
                'scripts/run ask --lane cli:ops "what is our deploy window?"',
                env={"GATEWAY_MODEL_BASE_URL": fake.anthropic_base_url},
            )
        [request] = fake.requests
        assert request.path.startswith("/v1/messages")
        assert any("sk-ant-..." in value for value in request.headers.values())  # the key went
    await _run(fresh, 'scripts/run ask --lane cli:ops "hello"')
    await _run(fresh, 'echo "hi from a pipe" | scripts/run ask --lane cli:ops -')
    await _run(fresh, "scripts/run ask --lane cli:ops")
    await _run(fresh, "scripts/run demo")


async def test_the_plugin_walkthrough(fresh: Copy, serve: object) -> None:
    start = serve
    assert callable(start)
    await start("GATEWAY_PLUGIN=examples.agent scripts/run")
    for text in ("when is the deploy window?", "deploy api"):
        await _run(
            fresh,
            "curl -s -X POST http://127.0.0.1:8787/web/threads/ship/messages -H 'content-type: "
            f'application/json\' -d \'{{"text": "{text}"}}\' >/dev/null',
        )
    thread = f"http://127.0.0.1:{fresh.port}/web/threads/ship"
    await _until(thread, '"kind":"approval_request"')
    await _run(fresh, "scripts/run ops approve web:ship --all --yes")
    await _until(thread, r"api deployed \(request ")
    # without a terminal, ask says what waits and which command asks again: that one works
    ran = await _run(fresh, 'GATEWAY_PLUGIN=examples.agent scripts/run ask "deploy api"')
    [hint] = re.findall(r"`(scripts/run ask --lane cli:default)` in a terminal", ran.output)
    status, printed = await asyncio.to_thread(_approve_on_a_terminal, fresh, hint)
    assert status == 0, printed
    assert re.search(r"api deployed \(request ", printed), printed


async def test_the_mcp_walkthrough(fresh: Copy, serve: object) -> None:
    start = serve
    assert callable(start)
    await start("scripts/run --config examples/mcp/gateway.toml")
    thread = f"http://127.0.0.1:{fresh.port}/web/threads/t1?space=desk"
    await _run(fresh, MCP_POST.format(text="create printer on fire"))
    await _until(thread, r"Created ticket #1: printer on fire")
    await _run(fresh, MCP_POST.format(text="delete 1"))
    waiting = await _until(thread, '"kind":"approval_request"')
    assert "Deleted ticket" not in waiting  # it waits for a person
    await _run(fresh, "scripts/run ops mcp --tools")
    await _run(fresh, "scripts/run ops approve desk/web:t1 --all --yes")
    await _until(thread, r"Deleted ticket #1: printer on fire")
    desk = json.loads((fresh.path / ".gateway" / "tickets.json").read_text())
    assert desk["tickets"] == {}  # the desk itself deleted it


def _approve_on_a_terminal(copy: Copy, command: str) -> tuple[int, str]:
    """`command` on a pty, answering y at its approval prompt."""
    terminal, tty = pty.openpty()
    env = {**copy.env, "GATEWAY_PLUGIN": "examples.agent"}
    with subprocess.Popen(
        ["bash", "-c", command], cwd=copy.path, env=env, stdin=tty, stdout=tty, stderr=tty
    ) as proc:
        os.close(tty)
        shown = b""
        deadline = time.monotonic() + 60
        while b"approve? [y/N] " not in shown:
            assert time.monotonic() < deadline and proc.poll() is None, shown.decode()
            if select.select([terminal], [], [], 0.5)[0]:
                shown += os.read(terminal, 4096)
        os.write(terminal, b"y\n")
        proc.wait(timeout=60)
        while select.select([terminal], [], [], 0.2)[0]:
            try:
                shown += os.read(terminal, 4096)
            except OSError:
                break
    os.close(terminal)
    return proc.returncode, shown.decode(errors="replace")


SLACK = (
    "GATEWAY_SLACK_BOT_TOKEN=xoxb-... GATEWAY_SLACK_APP_TOKEN=xapp-... "
    'GATEWAY_SLACK_APPROVERS=\'{"C0123ABCD": ["U0456EFGH", "S0789IJKL"], "*": ["U0999MNOP"]}\' '
    "scripts/run"
)


async def test_the_slack_and_email_start_commands(fresh: Copy, serve: object) -> None:
    start = serve
    assert callable(start)
    async with FakeSlack(channels=("C0123ABCD",)) as slack:
        slack.bot_token, slack.app_token = "xoxb-...", "xapp-..."
        slack_served = await start(SLACK, env={"GATEWAY_SLACK_API_URL": slack.api_url})
        await slack.wait_connected(1, timeout=60)
        envelope = await slack.send_event(slack.mention_event("C0123ABCD", "hello"))
        await slack.wait_ack(envelope)
        # the answer is streamed into one message, which the durable reply then finishes
        deadline = time.monotonic() + 30
        while not any(m.metadata and "You said" in m.text for m in slack.bot_messages()):
            assert time.monotonic() < deadline, [m.text for m in slack.bot_messages()]
            await asyncio.sleep(0.1)
        await _ctrl_c(SLACK, slack_served)  # one port: the email command's turn
    # the email command as typed: example.com cannot be reached, so it starts and keeps trying
    email = await start(
        "GATEWAY_EMAIL_ADDRESS=agent@example.com GATEWAY_EMAIL_PASSWORD='app-password' "
        "GATEWAY_EMAIL_IMAP_HOST=imap.example.com GATEWAY_EMAIL_SMTP_HOST=smtp.example.com "
        "scripts/run"
    )
    assert "Email: answering mail to agent@example.com" in email.output()


async def test_the_benchmarks_run(fresh: Copy, tmp_path: Path) -> None:
    """The README's benchmark commands at small sizes, in this checkout's venv (test extras)."""
    for bench in BENCHES.values():
        if bench.here is None:
            continue
        command = bench.here.replace("{tmp}", str(tmp_path))
        proc = await asyncio.create_subprocess_exec(
            "bash",
            "-c",
            command.replace(".venv/bin/python", sys.executable, 1),
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 180)
        assert proc.returncode == 0, f"{command}:\n{out.decode()}"
        assert re.search(bench.shows, out.decode()), f"{command}:\n{out.decode()}"


def test_every_step_was_run(fresh: Copy, request: pytest.FixtureRequest) -> None:
    """Runs last (pytest keeps file order): each command with a `Step` was run above.

    Only when every test of this file ran (a ``-k`` selection of some runs only theirs).
    """
    here = [item for item in request.session.items if item.path == Path(__file__)]
    if len(here) == sum(name.startswith("test_") for name in globals()):
        assert sorted(set(STEPS) - set(fresh.ran)) == []
