"""The `gateway` command used the way a hostile (or unlucky) user uses it.

Whatever goes wrong is one line on stderr and a non-zero status, never a traceback: settings
that are no settings, stores that cannot be opened or written, a corrupt database, a reader
that closes the pipe, Ctrl-C in the middle of a run (which aborts the run: the store shows it
finished, not open), two `ask` processes on one session (the second waits its turn, or says
who holds the session), and a model that fails (the line says why: no key, the connection
refused, what the provider answered, or no answer within the timeout).

The real-process cases run ``python -m gateway`` with a clean ``GATEWAY_*`` environment, in a
directory of their own (no ``.env`` is read), against the local fake LLM server.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import random
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from pydantic import SecretStr

from config import Settings
from gateway import ask as ask_module
from gateway.cli import main, show
from harness_core.errors import SessionError
from harness_core.storage import open_repo
from harness_core.storage.sqlite import SCHEMA_VERSION
from tests.support.fake_llm import FakeLLM, allow_model_requests

ROOT = Path(__file__).resolve().parents[2]
WAIT = 60.0
"""The longest any one process of these tests may take (a hung process fails the test)."""


def one_line(err: str) -> str:
    """The single line on stderr (anything more, or a traceback, fails)."""
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("gateway: "), err
    return lines[0]


def environment(**settings: str) -> dict[str, str]:
    """This process's environment without any GATEWAY_* or provider key, plus `settings`."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("GATEWAY_") and key not in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")
    }
    env.update({f"GATEWAY_{key.upper()}": value for key, value in settings.items()})
    env["PYTHONPATH"] = str(ROOT)
    return env


def _default_sigint() -> None:
    # a child of a shell that ignores SIGINT (a background job) would ignore Ctrl-C as well
    signal.signal(signal.SIGINT, signal.SIG_DFL)


_SPAWNED: list[asyncio.subprocess.Process] = []


@pytest.fixture(autouse=True)
async def _no_process_outlives_its_test() -> AsyncIterator[None]:
    yield
    while _SPAWNED:
        process = _SPAWNED.pop()
        if process.returncode is None:
            process.kill()
            await process.wait()


async def start(cwd: Path, *args: str, **settings: str) -> asyncio.subprocess.Process:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",
        *args,
        cwd=cwd,
        env=environment(**settings),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        preexec_fn=_default_sigint,
    )
    _SPAWNED.append(process)
    return process


async def finish(process: asyncio.subprocess.Process) -> tuple[int, str, str]:
    out, err = await asyncio.wait_for(process.communicate(), WAIT)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def gateway(cwd: Path, *args: str, **settings: str) -> tuple[int, str, str]:
    return await finish(await start(cwd, *args, **settings))


async def store_show(url: str) -> str:
    """What `gateway store show cli --store URL` prints."""
    repo = open_repo(url)
    out: list[str] = []
    try:
        await show(repo, "cli", out)
    finally:
        await repo.close()
    return "\n".join(out)


def has_open(pid: int, path: Path) -> bool:
    """Whether process `pid` has `path` open (Linux: its /proc/PID/fd links)."""
    try:
        return any(os.path.realpath(fd) == str(path) for fd in Path(f"/proc/{pid}/fd").iterdir())
    except OSError:  # a descriptor closed while listed
        return False


async def ask_in_flight(tmp_path: Path, fake: FakeLLM, *args: str) -> asyncio.subprocess.Process:
    """`gateway ask ARGS` against a model that never answers, once its request is in flight."""
    fake.hang()
    asking = await start(
        tmp_path,
        "ask",
        *args,
        model="openai:test-model",
        model_api_key="sk-test",
        model_base_url=fake.openai_base_url,
    )
    await asyncio.wait_for(fake.wait_for_requests(1), WAIT)
    return asking


async def opened(process: asyncio.subprocess.Process, path: Path) -> None:
    """Wait until `process` has `path` open (it reached the store: past its imports)."""
    for _ in range(int(WAIT / 0.05)):
        assert process.returncode is None
        if has_open(process.pid, path):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{path} was never opened")


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # nothing listens there once it is closed


@pytest.fixture
async def fake() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as server:
        yield server


# --- settings --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("GATEWAY_NOPE", "1", "gateway: unknown setting GATEWAY_NOPE in the environment"),
        ("GATEWAY_MODEL_TIMEOUT_SECONDS", "soon", "gateway: model_timeout_seconds='soon'"),
        ("GATEWAY_PORT", "99999", "gateway: port='99999' (GATEWAY_PORT in the environment)"),
        (  # it failed after the stores were made, exit 1
            "GATEWAY_MODEL",
            "gpt-4",
            "gateway: model='gpt-4' (GATEWAY_MODEL in the environment): expected provider:model_id",
        ),
        (  # a typo bound nothing, and the gateway started
            "GATEWAY_ROUTES",
            '[{"channel": "wbe", "space": "x", "session": "s"}]',
            "gateway: routes[0] names the channel 'wbe', which this gateway does not have (did "
            "you mean 'web'? its channels: web, slack, email, webhook, cli)",
        ),
        (
            "GATEWAY_ROUTES",
            '[{"channel": "nochan", "session": "s"}]',
            "gateway: routes[0] names the channel 'nochan', which this gateway does not have "
            "(its channels: web, slack, email, webhook, cli)",
        ),
    ],
)
def test_a_setting_that_cannot_work_is_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    variable: str,
    value: str,
    said: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(variable, value)
    assert main(["store", "list"]) == 2
    assert one_line(capsys.readouterr().err).startswith(said)


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        (
            "GATEWAY_STORE_URL",
            "sqlite://x.db",
            "gateway: store_url (GATEWAY_STORE_URL in the environment): "
            "store URL 'sqlite://x.db': expected",
        ),
        (
            "GATEWAY_STORE_URL",
            "redis://",
            "gateway: store_url (GATEWAY_STORE_URL in the environment): "
            "store URL 'redis://': a host is required",
        ),
        (
            "GATEWAY_BROKER_URL",
            "sqlite://x",
            "gateway: broker_url (GATEWAY_BROKER_URL in the environment): "
            "broker URL 'sqlite://x': expected",
        ),
        (  # was said as a "store URL", naming no variable (an outside probe)
            "GATEWAY_REDIS_URL",
            "redis://:secret@h:99999/0",
            "gateway: redis_url (GATEWAY_REDIS_URL in the environment): "
            "'redis://:***@h:99999/0': the port must be a number from 1 to 65535; "
            "expected a Redis URL",
        ),
        (
            "GATEWAY_REDIS_URL",
            "redis+cluster://h:6379/2",
            "gateway: redis_url (GATEWAY_REDIS_URL in the environment): "
            "'redis+cluster://h:6379/2': a Redis Cluster has database 0 only",
        ),
        (  # was checked only when the channel opened it: exit 1, naming no setting
            "GATEWAY_WEB_URL",
            "sqlite:///a-dir",
            "gateway: web_url (GATEWAY_WEB_URL in the environment): "
            "web mailbox URL 'sqlite:///a-dir': a-dir is a directory",
        ),
    ],
)
def test_serve_with_a_malformed_store_or_broker_url_is_a_setting_error(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    variable: str,
    value: str,
    said: str,
) -> None:
    """`serve` exited 1 for the URL `store --store` and `ask --store` exit 2 for (D301)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-dir").mkdir()
    monkeypatch.setenv("GATEWAY_PORT", str(_free_port()))
    monkeypatch.setenv(variable, value)
    assert main(["serve"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("gateway:")]
    assert len(lines) == 1 and lines[0].startswith(said), lines


def test_a_server_that_fails_once_listening_exits_1_with_one_line(tmp_path: Path) -> None:
    # a webhook URL's port of 99999 raised in the banner: `serve` stopped and exited 0, silent
    (tmp_path / "failing.py").write_text(
        "import sys, gateway.serve\n"
        "def banner_fails(*_):\n"
        "    raise ValueError('Port out of range 0-65535')\n"
        "gateway.serve.channel_lines = banner_fails\n"
        "from gateway.cli import main\n"
        "sys.exit(main(['serve']))\n"
    )
    done = subprocess.run(
        [sys.executable, "failing.py"],
        cwd=tmp_path,
        env=environment(port=str(_free_port())),
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
    lines = [line for line in done.stderr.splitlines() if line.startswith("gateway:")]
    assert (done.returncode, lines) == (
        1,
        ["gateway: stopped: the server failed (ValueError: Port out of range 0-65535)"],
    )


@pytest.mark.parametrize(
    ("words", "said"),
    [
        (["ask", "--lane", "", "hi"], "gateway: invalid lane name '': 1-512 characters"),
        (
            ["ask", "--lane", "x" * 5000, "hi"],
            "gateway: invalid lane name 'xxxxxxxxxx",  # cut: it was echoed whole
        ),
        (["store", "show", ""], "gateway: invalid session id '': 1-200 of ASCII letters"),
    ],
)
def test_a_name_on_the_command_line_that_is_no_name_is_a_usage_error(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    words: list[str],
    said: str,
) -> None:
    """They exited 1, as if the command had failed doing its work."""
    monkeypatch.chdir(tmp_path)
    store = f"sqlite:///{tmp_path}/gw.db"
    assert asyncio.run(_made(store)) is None
    assert main([*words, "--store", store]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(said) and len(line) < 200, line


async def _made(url: str) -> None:
    repo = open_repo(url)
    try:
        assert await ask_module.ask(repo, Settings(), "cli:default", "hello", []) == 0
    finally:
        await repo.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("question", [[""], ["  ", "\t"]])
def test_an_empty_question_is_one_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], question: list[str]
) -> None:
    store = tmp_path / "store.db"
    assert main(["ask", *question, "--store", f"sqlite:///{store}"], settings=Settings()) == 2
    assert one_line(capsys.readouterr().err) == (
        "gateway: the question is empty (the web channel refuses empty text too)"
    )
    assert not store.exists()


@pytest.mark.parametrize(
    ("question", "said"),
    [
        # what a shell hands over for bytes that are no UTF-8 (argv decodes them so)
        (b"bad \xff\xfe utf8".decode("utf-8", "surrogateescape"), "is not valid Unicode text"),
        ("a \x00 nul", "must not contain NUL characters"),
    ],
)
def test_a_question_no_store_can_hold_is_one_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], question: str, said: str
) -> None:
    """It was the harness's fault line ("record ... is not JSON-serializable"), exit 1."""
    store = tmp_path / "store.db"
    assert main(["ask", question, "--store", f"sqlite:///{store}"], settings=Settings()) == 2
    assert one_line(capsys.readouterr().err) == (
        f"gateway: the question {said} (the web channel refuses it too)"
    )
    assert not store.exists()


_NOT_UTF8 = b"web:\xff".decode("utf-8", "surrogateescape")


@pytest.mark.parametrize(
    ("words", "named"),
    [
        (["ask", "--lane", _NOT_UTF8, "hi"], "gateway ask: --lane"),
        (["ops", "timeline", _NOT_UTF8], "gateway ops timeline: lane"),
        (
            ["ops", "deny", "web:x", "--all", "--reason", _NOT_UTF8, "--yes"],
            "gateway ops deny: --reason",
        ),
    ],
)
def test_an_argument_that_is_not_utf8_is_a_usage_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], words: list[str], named: str
) -> None:
    """It was "unexpected UnicodeEncodeError", exit 1, after an operator's preview."""
    store = tmp_path / "store.db"
    status: int | str | None
    try:
        status = main([*words, "--store", f"sqlite:///{store}"], settings=Settings())
    except SystemExit as exited:  # argparse's own exit, as for every usage error
        status = exited.code
    assert status == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"{named} is not valid Unicode text (bytes that are not UTF-8)"), err
    assert not store.exists()


# --- the store -------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["ask", "hi"], ["demo"]])
def test_a_store_where_nothing_can_be_written_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    assert main([*command, "--store", "sqlite:////proc/x.db"], settings=Settings()) == 1
    line = one_line(capsys.readouterr().err)
    assert line.startswith("gateway: cannot use the store sqlite:////proc/x.db: ")
    assert "unable to open database file" in line


def test_a_store_under_a_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("not a directory")
    for url in (f"sqlite:///{tmp_path}/file/gw.db", f"jsonl:///{tmp_path}/file/sessions"):
        assert main(["ask", "--store", url, "hi"], settings=Settings()) == 2
        assert f"{tmp_path}/file is not a directory" in one_line(capsys.readouterr().err)


@pytest.mark.parametrize("command", [["store"], ["store", "show", "cli"], ["ask", "hi"], ["demo"]])
def test_a_corrupt_database_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    (tmp_path / "gw.db").write_bytes(random.Random(13).randbytes(8192))
    url = f"sqlite:///{tmp_path}/gw.db"
    assert main([*command, "--store", url], settings=Settings()) == 1
    assert one_line(capsys.readouterr().err) == (
        f"gateway: cannot use the store {url}: file is not a database "
        "(damaged, or not a SQLite file)"
    )


def _without_root_powers() -> Callable[[], None] | None:
    """For a child process: drop the capabilities that let root write a read-only file."""
    if os.geteuid() != 0:
        return None
    libc = ctypes.CDLL(None, use_errno=True)

    def drop() -> None:
        for capability in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
            if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
                raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")

    return drop


def _without_write_access(store: Path, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``gateway ARGV`` where it can read `store` (a directory) but write nothing in it."""
    drop = _without_root_powers()
    for item in store.iterdir():
        item.chmod(0o444)
    store.chmod(0o555)
    try:
        try:
            probe = subprocess.run(
                ["touch", str(store / "probe")],
                preexec_fn=drop,
                stderr=subprocess.DEVNULL,
                check=False,
            )
        except subprocess.SubprocessError:
            pytest.fail("cannot drop root's file capabilities here: the test cannot run")
        if probe.returncode == 0:
            pytest.fail("this user writes read-only files anyway: the test cannot run")
        return subprocess.run(
            [sys.executable, "-m", "gateway", *argv],
            cwd=cwd,
            env=environment(),
            capture_output=True,
            text=True,
            timeout=WAIT,
            preexec_fn=drop,
            check=False,
        )
    finally:
        store.chmod(0o755)


def test_a_read_only_database_is_one_line(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    url = f"sqlite:///{store}/gw.db"
    assert main(["ask", "--store", url, "hello"], settings=Settings()) == 0
    done = _without_write_access(store, "ask", "--store", url, "again", cwd=tmp_path)
    assert done.returncode == 1, done
    assert one_line(done.stderr) == (
        f"gateway: cannot use the store {url}: attempt to write a readonly database "
        "(the file cannot be written)"
    )


def test_a_store_that_cannot_be_written_is_still_read(tmp_path: Path) -> None:
    # a backup on read-only media, or another user's store: SQLite wants to write the WAL's
    # index beside the file, and `store` refused to read it at all (D394)
    store = tmp_path / "store"
    store.mkdir()
    url = f"sqlite:///{store}/gw.db"
    assert main(["ask", "--store", url, "hello"], settings=Settings()) == 0
    assert sorted(p.name for p in store.iterdir()) == ["gw.db"]
    listed = _without_write_access(store, "store", "list", "--store", url, cwd=tmp_path)
    assert (listed.returncode, listed.stdout, listed.stderr) == (0, "cli\n", "")
    checked = _without_write_access(store, "store", "check", "--store", url, cwd=tmp_path)
    assert checked.returncode == 0, checked
    assert checked.stdout.startswith("checked 1 session, ") and "clean" in checked.stdout
    shown = _without_write_access(store, "store", "show", "cli", "--store", url, cwd=tmp_path)
    assert shown.returncode == 0, shown
    assert "hello" in shown.stdout
    assert sorted(p.name for p in store.iterdir()) == ["gw.db"]  # nothing left beside it


def test_a_write_ahead_log_it_cannot_read_is_named_not_silently_skipped(tmp_path: Path) -> None:
    # a store copied while a gateway ran: its -wal holds commits the file does not; read
    # without them the newest messages would be missing with no word said
    live = tmp_path / "live"
    url = f"sqlite:///{live}/gw.db"
    assert main(["ask", "--store", url, "hello"], settings=Settings()) == 0
    writer = sqlite3.connect(live / "gw.db")
    try:
        writer.execute("PRAGMA wal_autocheckpoint=0")
        writer.execute("CREATE TABLE late (x)")
        writer.commit()
        copy = tmp_path / "copy"
        copy.mkdir()
        for name in ("gw.db", "gw.db-wal"):
            shutil.copyfile(live / name, copy / name)
    finally:
        writer.close()
    assert (copy / "gw.db-wal").stat().st_size > 0
    copied = f"sqlite:///{copy}/gw.db"
    done = _without_write_access(copy, "store", "list", "--store", copied, cwd=tmp_path)
    assert done.returncode == 1, done
    assert one_line(done.stderr) == (
        f"gateway: cannot use the store {copied}: {copy}/gw.db-wal holds commits not yet in the "
        "file, and SQLite reads them only where it can write (read it as the gateway's user, or "
        "copy the directory somewhere writable)"
    )


async def test_a_reader_that_closes_the_pipe_ends_it_quietly(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/gw.db"
    repo = open_repo(url)
    try:
        assert await ask_module.ask(repo, Settings(), "cli:default", "hello", []) == 0
    finally:
        await repo.close()
    # `gateway store show cli | head -0`: the reader is gone before the first line is written
    read, write = os.pipe()
    os.close(read)
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "gateway", "store", "show", "cli", "--store", url),
            cwd=tmp_path,
            env=environment(),
            stdout=write,
            stderr=asyncio.subprocess.PIPE,
        )
    finally:
        os.close(write)
    _, err = await asyncio.wait_for(process.communicate(), WAIT)
    assert process.returncode == 141  # as a shell reports `cat` killed by SIGPIPE
    assert err.decode() == ""  # like `cat`, nothing to say: the reader chose to stop


_KEPT = "; the answer is stored (`gateway store show cli` shows lane cli:io)"


@pytest.mark.parametrize(
    ("stdin", "stdout", "said", "status"),
    [
        # `ask - <&-`: "unexpected error: AttributeError: 'NoneType' object has no attribute"
        ("closed", "pipe", "there is no standard input to read the question from", 2),
        # `>&-`: the same AttributeError; `> /dev/full`: the OSError, Python's "Exception
        # ignored" lines, and exit status 120
        # and then "what was asked is stored" said nothing of where (an outside probe)
        ("devnull", "closed", f"there is no standard output to write to (it was closed){_KEPT}", 1),
        ("devnull", "full", f"cannot write to standard output (No space left on device){_KEPT}", 1),
    ],
)
async def test_standard_streams_that_are_closed_or_full_are_one_line(
    tmp_path: Path, stdin: str, stdout: str, said: str, status: int
) -> None:
    question = "-" if stdin == "closed" else "hello"
    words = ("ask", "--store", f"sqlite:///{tmp_path}/gw.db", "--lane", "cli:io", question)
    with open("/dev/full", "wb") as full:  # noqa: ASYNC230 (a device: nothing blocks)
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "gateway", *words),
            cwd=tmp_path,
            env=environment(),
            stdin=subprocess.DEVNULL,
            stdout=full if stdout == "full" else subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            preexec_fn=lambda: _close_streams(stdin == "closed", stdout == "closed"),
        )
        _, err = await asyncio.wait_for(process.communicate(), WAIT)
    assert one_line(err.decode()).startswith(f"gateway: {said}")
    assert process.returncode == status


async def test_an_ask_with_standard_error_closed_keeps_its_notes_off_standard_output(
    tmp_path: Path,
) -> None:
    # `ask hello 2>&-`: the token note went to stdout, into whatever read the answer
    words = ("ask", "--store", f"sqlite:///{tmp_path}/gw.db", "--lane", "cli:io", "hello")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "gateway", *words),
        cwd=tmp_path,
        env=environment(),
        stdin=subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        preexec_fn=lambda: os.close(2),
    )
    out, _ = await asyncio.wait_for(process.communicate(), WAIT)
    assert (process.returncode, out.decode()) == (0, "You said: hello\n")


def _close_streams(stdin: bool, stdout: bool) -> None:
    if stdin:
        os.close(0)
    if stdout:
        os.close(1)


# --- Ctrl-C and two processes ----------------------------------------------------------------


async def test_ctrl_c_aborts_the_running_ask_and_the_store_shows_it_finished(
    tmp_path: Path, fake: FakeLLM
) -> None:
    url = f"sqlite:///{tmp_path}/gw.db"
    asking = await ask_in_flight(
        tmp_path, fake, "--store", url, "what is our deploy window?"
    )  # the model call is in flight
    asking.send_signal(signal.SIGINT)
    code, out, err = await finish(asking)
    assert code == 130
    assert one_line(err) == "gateway: interrupted: the run on lane cli:default was aborted"
    assert out == ""

    shown = await store_show(url)
    assert "lane cli:default" in shown and "(idle)" in shown
    assert "(open operation)" not in shown
    assert "abort_requested" in shown
    assert shown.rstrip().endswith("operation_finished aborted")


async def test_ctrl_c_names_a_never_repeated_call_that_ran_before_the_abort(
    tmp_path: Path,
) -> None:
    """A `create_ticket` cut by Ctrl-C had made the ticket, and `ask` said only "aborted"; the
    thread's own stop notice names such a call (D353). This charge does not watch the abort:
    it ends, charged, and the run then stops."""
    url = f"sqlite:///{tmp_path}/gw.db"
    asking = await start(
        tmp_path, "ask", "--store", url, "/slowcharge 1500", plugin="tests.support.gateway_agent"
    )
    for _ in range(int(WAIT / 0.05)):  # the charge runs
        with contextlib.suppress(SessionError):  # not created yet
            if "tool_started" in await store_show(url):
                break
        await asyncio.sleep(0.05)
    asking.send_signal(signal.SIGINT)
    code, out, err = await finish(asking)
    assert (code, out) == (130, "")
    # a charge still running 1.5 s after the abort is said to be waited for, first
    notice = "(stopping: the run ends once its running step does, within 15 s; Ctrl-C again"
    err = err.removeprefix(f"{notice} to stop waiting)\n")
    assert one_line(err) == (
        "gateway: interrupted: the run on lane cli:default was aborted; before it stopped, "
        "this had already run: charge"
    )


async def test_sigterm_is_a_ctrl_c_and_a_killed_ask_s_lease_is_taken_at_once(
    tmp_path: Path, fake: FakeLLM
) -> None:
    """SIGTERM ended `ask` holding the session's lease: the next one waited 10 s, then said the
    dead process held it. SIGTERM now aborts like Ctrl-C; a SIGKILLed one's lease is taken."""
    url = f"sqlite:///{tmp_path}/gw.db"
    asking = await ask_in_flight(tmp_path, fake, "--store", url, "what is our deploy window?")
    asking.send_signal(signal.SIGTERM)
    code, out, err = await finish(asking)
    assert (code, out) == (130, "")
    assert one_line(err) == "gateway: interrupted: the run on lane cli:default was aborted"

    fake.hang()
    killed = await start(
        tmp_path,
        "ask",
        *("--store", url, "--lane", "cli:k", "again"),
        model="openai:test-model",
        model_api_key="sk-test",
        model_base_url=fake.openai_base_url,
    )
    await asyncio.wait_for(fake.wait_for_requests(2), WAIT)  # it holds the lease now
    killed.kill()  # no handler runs: it dies holding the lease (30 s)
    await killed.wait()
    # it took the dead one's lease: it waited 10 s, then said a dead process held it (exit 1)
    code, out, err = await gateway(tmp_path, "ask", "--store", url, "--lane", "cli:next", "hi")
    assert code == 0 and _TOKENS_ONLY.fullmatch(err), err
    assert out.splitlines()[0] == "You said: hi"


_TOKENS_ONLY = re.compile(r"\(scripted:echo: \d+ tokens in, \d+ out\)\n")
"""A successful ask's stderr: the tokens it took, and nothing else."""


async def test_ctrl_c_twice_stops_at_once_still_in_one_line(tmp_path: Path, fake: FakeLLM) -> None:
    url = f"sqlite:///{tmp_path}/gw.db"
    asking = await ask_in_flight(tmp_path, fake, "--store", url, "what is our deploy window?")
    asking.send_signal(signal.SIGINT)
    await asyncio.sleep(0.002)
    asking.send_signal(signal.SIGINT)  # while the first is handled: no KeyboardInterrupt mid-write
    code, out, err = await finish(asking)
    assert (code, out) == (130, "")
    assert one_line(err) in (
        "gateway: interrupted: the run on lane cli:default was aborted",  # one signal, merged
        "gateway: interrupted twice: stopped without waiting for the run on lane cli:default to "
        "end (if it stays open, the next `gateway ask --lane cli:default` resumes it)",
    )
    assert "lane cli:default" in await store_show(url)


async def test_a_second_ask_waits_for_the_first_and_neither_faults(
    tmp_path: Path, fake: FakeLLM
) -> None:
    url = f"sqlite:///{tmp_path}/gw.db"
    first = await ask_in_flight(
        tmp_path, fake, "--store", url, "--lane", "cli:slow", "first"
    )  # it holds the session now
    second = await start(tmp_path, "ask", "--store", url, "second")  # scripted:echo
    await opened(second, tmp_path / "gw.db")
    await asyncio.sleep(0.5)  # the second is waiting for the session's lease
    assert second.returncode is None
    first.send_signal(signal.SIGINT)
    code, _, err = await finish(first)
    assert (code, one_line(err)) == (
        130,
        "gateway: interrupted: the run on lane cli:slow was aborted",
    )
    code, out, err = await finish(second)
    assert code == 0 and _TOKENS_ONLY.fullmatch(err), err
    assert out.splitlines()[0] == "You said: second"

    shown = await store_show(url)
    assert "(open operation)" not in shown
    assert "operation_resumed" not in shown  # the second never took the first's run over
    finished = [line.split()[-1] for line in shown.splitlines() if "operation_finished" in line]
    assert finished == ["aborted", "completed"]


async def test_ctrl_c_while_waiting_for_the_session_is_one_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/gw.db"
    repo = open_repo(url)
    try:
        await repo.create("cli")
        await repo.acquire_lease("cli", owner="someone else", ttl_ms=60_000)
        waiting = await start(tmp_path, "ask", "--store", url, "hi")
        await opened(waiting, tmp_path / "gw.db")
        await asyncio.sleep(0.5)  # waiting for the session's lease
        assert waiting.returncode is None
        waiting.send_signal(signal.SIGINT)
        code, out, err = await finish(waiting)
    finally:
        await repo.close()
    assert (code, out, one_line(err)) == (130, "", "gateway: interrupted")


async def test_a_session_held_too_long_says_who_holds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ask_module, "LEASE_WAIT_SECONDS", 0.3)
    url = f"sqlite:///{tmp_path}/gw.db"
    repo = open_repo(url)
    try:
        await repo.create("cli")
        await repo.acquire_lease("cli", owner="gateway ask (pid 4242 on elsewhere)", ttl_ms=60_000)
        out: list[str] = []
        with pytest.raises(ask_module.AskFailed) as failed:
            await ask_module.ask(repo, Settings(), "cli:default", "hi", out)
    finally:
        await repo.close()
    said = str(failed.value)
    assert failed.value.status == 1
    assert said.startswith(
        "session 'cli' is in use by gateway ask (pid 4242 on elsewhere), its lease running until "
    )
    assert said.endswith("unless renewed; waited 0.3 s: try again when it is done")


# --- the model -------------------------------------------------------------------------------


def test_a_model_without_its_key_is_one_line_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    url = f"sqlite:///{tmp_path}/gw.db"
    assert main(["ask", "--store", url, "hi"], settings=Settings(model="openai:gpt-4.1-mini")) == 2
    assert one_line(capsys.readouterr().err) == (
        "gateway: GATEWAY_MODEL='openai:gpt-4.1-mini' needs an API key: set "
        "GATEWAY_MODEL_API_KEY (or OPENAI_API_KEY)"
    )
    assert not (tmp_path / "gw.db").exists()


async def test_a_model_failure_says_its_real_cause(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Connection refused, HTTP 401 (one quoting the key) and 500, and a provider that never
    answers (in parallel).

    The line on stderr is ``gateway: `` and the `AskFailed` message (see the Ctrl-C tests).
    """
    async with (
        FakeLLM() as refusing,
        FakeLLM() as echoing,
        FakeLLM() as failing,
        FakeLLM() as hanging,
    ):
        refusing.fail(status=401)
        echoing.fail(status=401, echo_key=True)
        for _ in range(3):
            failing.fail(status=500)
            hanging.hang()
        port = closed_port()
        cases: dict[str, tuple[Settings, str]] = {
            "refused": (
                Settings(
                    model="openai-compatible:x",
                    model_api_key=SecretStr("dummy"),
                    model_base_url=f"http://127.0.0.1:{port}/v1",
                ),
                "the model failed 3 times; the last error: ModelConnectionError: cannot "
                f"connect to http://127.0.0.1:{port}/v1 (Connection refused)",
            ),
            "401": (
                Settings(
                    model="openai:test-model",
                    model_api_key=SecretStr("sk-wrong"),
                    model_base_url=refusing.openai_base_url,
                ),
                "the run failed: ModelAuthenticationError: HTTP 401 from "
                f"{refusing.openai_base_url} for model test-model: Incorrect API key provided "
                "(scripted by FakeLLM).",
            ),
            "401 quoting the key": (
                Settings(
                    model="openai:test-model",
                    model_api_key=SecretStr("sk-echoed-0123456789"),
                    model_base_url=echoing.openai_base_url,
                ),
                "the run failed: ModelAuthenticationError: HTTP 401 from "
                f"{echoing.openai_base_url} for model test-model: Incorrect API key provided "
                "(scripted by FakeLLM): [redacted].",
            ),
            "500": (
                Settings(
                    model="anthropic:test-model",
                    model_api_key=SecretStr("sk-test"),
                    model_base_url=failing.anthropic_base_url,
                ),
                "the model failed 3 times; the last error: ModelServerError: HTTP 500 from "
                f"{failing.anthropic_base_url} for model test-model: The server had an error "
                "while processing your request (scripted by FakeLLM).",
            ),
            "hang": (
                Settings(
                    model="openai:test-model",
                    model_api_key=SecretStr("sk-test"),
                    model_base_url=hanging.openai_base_url,
                    model_timeout_seconds=0.5,
                ),
                "the model failed 3 times; the last error: ModelTimeoutError: no answer from "
                f"{hanging.openai_base_url} within 0.5 s (GATEWAY_MODEL_TIMEOUT_SECONDS)",
            ),
        }

        async def failure(name: str, settings: Settings) -> tuple[str, int, str]:
            repo = open_repo(f"sqlite:///{tmp_path}/{name}.db")
            try:
                await ask_module.ask(repo, settings, "cli:default", "hi", [])
            except ask_module.AskFailed as exc:
                return name, exc.status, str(exc)
            finally:
                await repo.close()
            return name, 0, "answered"

        with allow_model_requests():
            said = await asyncio.gather(
                *(failure(name, settings) for name, (settings, _) in cases.items())
            )
    assert said == [(name, 1, line) for name, (_, line) in cases.items()]
    assert len(refusing.requests) == 1  # a refused key is not retried
    assert len(failing.requests) == len(hanging.requests) == 3
    # the waits between attempts are said as they begin, not only the end (stderr)
    retried = capsys.readouterr().err.splitlines()
    for kind in ("network", "server", "timeout"):
        assert [line for line in retried if f": {kind};" in line] == [
            f"(the model request failed: {kind}; attempt 2 of 3 in 1 s)",
            f"(the model request failed: {kind}; attempt 3 of 3 in 2 s)",
        ], retried
    assert not any(": auth;" in line for line in retried)


@pytest.mark.parametrize("after_s", [0.15, 0.3])
async def test_ctrl_c_while_the_command_loads_is_one_line(tmp_path: Path, after_s: float) -> None:
    """A Ctrl-C in the first few hundred ms (the imports) printed Python's traceback."""
    loading = await start(tmp_path, "store", "list")
    await asyncio.sleep(after_s)
    loading.send_signal(signal.SIGINT)
    code, _, err = await finish(loading)
    assert "Traceback" not in err, err
    if code == 130:  # noted while it loaded, or the command's own handler's
        assert one_line(err).startswith("gateway: interrupted"), err
    else:  # done before it came (no store here: exit 1), or before Python's handler was set
        assert code in (1, -signal.SIGINT), (code, err)
        assert err == "" or one_line(err).startswith("gateway: no store at"), err


def test_escape_sequences_in_an_answer_are_shown_not_obeyed_on_a_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An answer (the echo: the question's own text) that sets the terminal's title."""
    url = f"sqlite:///{tmp_path}/gw.db"
    question = "hi \x1b]0;pwned\x07 \x1b[2J there"
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert main(["ask", "--store", url, question], settings=Settings()) == 0
    shown = capsys.readouterr().out
    assert "\x1b" not in shown and "\x07" not in shown
    assert "You said: hi \\x1b]0;pwned\\x07 \\x1b[2J there" in shown
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)  # a pipe: the text as it is
    assert main(["ask", "--store", url, "--lane", "cli:pipe", question], settings=Settings()) == 0
    assert f"You said: {question}" in capsys.readouterr().out
    # what `store show` prints is people's text for people, piped to `less -R` too: escaped
    # always, as `ops timeline` does (an outside probe)
    assert main(["store", "show", "cli", "--store", url], settings=Settings()) == 0
    shown = capsys.readouterr().out
    assert "\x1b" not in shown and "hi \\x1b]0;pwned\\x07 \\x1b[2J there" in shown


@pytest.mark.parametrize(
    ("given", "status", "shown"),
    [
        (b"first line\nsecond line\n", 0, "You said: first line\nsecond line\n"),
        (b"caf\xc3\xa9", 0, "You said: café\n"),
        (b"caf\xe9", 2, "gateway: the question on standard input is not UTF-8 text\n"),
        (b"\n", 2, "gateway: the question is empty"),
        (b"x" * ((1 << 20) + 1), 2, "gateway: the question on standard input is longer than"),
    ],
)
def test_a_question_from_standard_input(
    tmp_path: Path, given: bytes, status: int, shown: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "ask", "--store", f"sqlite:///{tmp_path}/gw.db", "-"],
        cwd=tmp_path,
        env=environment(),
        input=given,
        capture_output=True,
        timeout=WAIT,
        check=False,
    )
    assert done.returncode == status, done.stderr
    said = (done.stdout if status == 0 else done.stderr).decode()
    assert said.startswith(shown), said


SLOW_TOOL_PLUGIN = """
import asyncio
import contextlib
from pathlib import Path

from pydantic import BaseModel

from harness_core import ModelRef, ScriptedModel, Tool, ToolResultMessage
from harness_core.models.scripted import text, tool_call


class NoArgs(BaseModel):
    pass


async def slow(args: NoArgs, ctx) -> str:
    Path("started").write_text("yes")
    await asyncio.sleep(4)  # it does not look at ctx.abort
    return "done"


def tools():
    return [Tool(name="slow", description="Slow.", execute=slow, args_model=NoArgs, replay="safe")]


def respond(request):
    if isinstance(request.messages[-1], ToolResultMessage):
        return text("finished")
    return tool_call("slow", {})


def model(settings):
    return ScriptedModel(responder=respond), ModelRef(provider="scripted", model_id="slow")
"""


async def test_ctrl_c_during_a_slow_tool_says_what_it_waits_for(tmp_path: Path) -> None:
    (tmp_path / "slow_plugin.py").write_text(SLOW_TOOL_PLUGIN)
    url = f"sqlite:///{tmp_path}/gw.db"
    asking = await start(tmp_path, "ask", "--store", url, "go", plugin="slow_plugin.py")
    for _ in range(int(WAIT / 0.05)):
        if (tmp_path / "started").exists():
            break
        await asyncio.sleep(0.05)
    asking.send_signal(signal.SIGINT)
    code, out, err = await finish(asking)
    assert (code, out) == (130, "")
    notice, last = err.splitlines()  # before: ten silent seconds, then only the last line
    assert notice == (
        "(stopping: the run ends once its running step does, within 15 s; Ctrl-C again to stop "
        "waiting)"
    )
    assert last == "gateway: interrupted: the run on lane cli:default was aborted"


def test_a_command_started_with_ctrl_c_ignored_takes_it_once_loaded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Started with SIGINT ignored (a background job of a script), the command put that back
    once its imports were loaded, and `serve` took SIGINT only once it listened: one sent
    while it started was lost, and it served on (an outside probe)."""
    import gateway.cli as cli_module
    from gateway.__main__ import main as entry

    seen: list[object] = []

    def run() -> int:
        seen.append(signal.getsignal(signal.SIGINT))
        return 0

    monkeypatch.setattr(cli_module, "main", run)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        assert entry() == 0
    finally:
        signal.signal(signal.SIGINT, previous)
    assert seen == [signal.default_int_handler]


def test_an_older_store_it_cannot_upgrade_is_named_not_read(tmp_path: Path) -> None:
    store = tmp_path / "store"
    url = f"sqlite:///{store}/gw.db"
    assert main(["ask", "--store", url, "hello"], settings=Settings()) == 0
    conn = sqlite3.connect(store / "gw.db")
    with conn:
        conn.execute("UPDATE schema_version SET version = 2")
    conn.close()
    done = _without_write_access(store, "store", "list", "--store", url, cwd=tmp_path)
    assert done.returncode == 1, done
    assert one_line(done.stderr) == (
        f"gateway: {store}/gw.db has schema version 2, expected {SCHEMA_VERSION}; nothing was "
        "written to it, and a gateway that can write it creates or upgrades it"
    )
