from __future__ import annotations

import faulthandler
import itertools
import json
import os
import sys
import threading
from collections.abc import AsyncIterator, Generator, Iterator
from typing import Any

import pytest

pytest.register_assert_rewrite("harness_core.testing")

# Headless Chromium fixtures (browser, page, console_errors) for the tests of the web pages, and
# the fake model provider's (fake, model_requests).
pytest_plugins = ["tests.support.browser", "tests.support.fake_llm_fixtures"]

import pydantic_ai.models  # noqa: E402

# No test may reach a real model provider; tests that talk to the local fake LLM server opt in
# with `tests.support.fake_llm.allow_model_requests()`.
pydantic_ai.models.ALLOW_MODEL_REQUESTS = False

from tests.support.redis_cluster import LocalRedisCluster  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402

_prefixes = itertools.count()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server for the whole run; tests isolate themselves with key prefixes."""
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRedisCluster]:
    """One local 3-master Redis Cluster for the whole run (started on first use)."""
    cluster = LocalRedisCluster(tmp_path_factory.mktemp("redis-cluster")).start()
    yield cluster
    cluster.stop()


@pytest.fixture(autouse=True)
async def _close_kit_repos() -> AsyncIterator[None]:
    yield
    from tests.support.harness_kit import OPEN_REPOS

    while OPEN_REPOS:
        await OPEN_REPOS.pop().close()


@pytest.fixture
def redis_prefix(worker_id: str = "w") -> str:
    """A key prefix no other test uses."""
    return f"t{next(_prefixes)}"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--phase",
        choices=("all", "shared", "alone"),
        default="all",
        help="shared: every test but those marked `alone`; alone: only those (scripts/test runs "
        "the shared ones on every core, then the `alone` ones by themselves)",
    )


_LONGEST_FIRST = (
    "tests/test_readme.py",
    "tests/gateway/test_serve_lifecycle.py",
    "tests/bench/test_prompt_instructions_smoke.py",
    "tests/gateway/test_cli_hostile.py",
    "tests/pages/test_web_page.py",
    "tests/gateway/test_reply_watermark.py",
    "tests/bench/test_turn_instructions_smoke.py",
    "tests/pages/test_ops_page.py",
    "tests/test_packaging.py",
    "tests/adapters/email/test_email_service.py",
    "tests/adapters/slack/test_slack_live_kill.py",
    "tests/ops/test_cli.py",
)
"""The test files that take longest (over half a minute each, `--durations`), started first.

`--dist loadfile` hands files out in collection order, and these sorted last or late by name
(``tests/test_readme.py``, 150 s, among the last): one core ran them alone for the run's last
minutes while the other had nothing left. Started first, the short files fill the end.
"""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`--phase`: keep the tests of one phase, deselect (and report) the others; the files of
    `_LONGEST_FIRST` first (in that order; every file's tests keep theirs)."""
    rank = {path: number for number, path in enumerate(_LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.partition("::")[0], len(rank)))  # stable
    phase = config.getoption("--phase")
    if phase == "all":
        return
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        alone = item.get_closest_marker("alone") is not None
        (keep if alone == (phase == "alone") else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


_GRACE_S = float(os.environ.get("TESTS_HANG_GRACE_S", "120"))
"""How long past its own timeout (doubled) a test may still run before the run is ended
(`tests/test_hang_guard.py` makes it short)."""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    """End the whole process when a test outlives its timeout twice over, plus `_GRACE_S`.

    pytest-timeout's signal lands in whatever the main thread runs: a test that started the
    service by mistake (``main([])`` serves) had the signal's exception taken as one more
    fault to survive, and served on until CI's 90 minutes. This thread does not ask: it prints
    every thread's stack and the test's name, then exits, and the run fails at once.
    """
    marker = item.get_closest_marker("timeout")
    own = marker.args[0] if marker is not None and marker.args else item.config.getini("timeout")
    limit = 2 * float(own or 60) + _GRACE_S

    def end() -> None:
        capture = item.config.pluginmanager.getplugin("capturemanager")
        if capture is not None:  # the test's output is captured: this must reach the terminal
            capture.suspend_global_capture(in_=True)
        sys.stderr.write(
            f"\n{item.nodeid} still runs {limit:.0f} s after it started, past twice its "
            "timeout: every thread's stack follows, then this process ends\n"
        )
        faulthandler.dump_traceback(all_threads=True)
        sys.stderr.flush()
        os._exit(3)

    watch = threading.Timer(limit, end)
    watch.daemon = True
    watch.start()
    try:
        yield
    finally:
        watch.cancel()


_TALLIES = "gateway-tallies"


def pytest_sessionfinish(session: pytest.Session) -> None:
    """On a pytest-xdist worker: hand what it tallied to the controller, which prints it."""
    output = getattr(session.config, "workeroutput", None)
    if output is None:
        return
    from tests.adapters.email.corpus_score import SCORES
    from tests.support.matrix_coverage import CRASH_POINTS, RACE_ORDERS

    output[_TALLIES] = json.dumps(
        {
            "crash_points": [[b, n, count] for (b, n), count in CRASH_POINTS.items()],
            "race_orders": {row: sorted(orders) for row, orders in RACE_ORDERS.items()},
            "corpus": SCORES,
        }
    )


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """On the pytest-xdist controller: add a finished worker's tallies to this process's."""
    sent = getattr(node, "workeroutput", {}).get(_TALLIES)
    if sent is None:
        return
    from tests.adapters.email.corpus_score import SCORES
    from tests.support.matrix_coverage import CRASH_POINTS, RACE_ORDERS

    tallies = json.loads(sent)
    for backend, name, count in tallies["crash_points"]:
        CRASH_POINTS[(backend, name)] = CRASH_POINTS.get((backend, name), 0) + count
    for row, orders in tallies["race_orders"].items():
        RACE_ORDERS.setdefault(row, set()).update(orders)
    SCORES.update(tallies["corpus"])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say how much of the crash matrix and the race catalog this run covered."""
    from tests.support.matrix_coverage import CRASH_POINTS, RACE_ORDERS

    if CRASH_POINTS:
        backends = sorted({backend for backend, _ in CRASH_POINTS})
        names = list(dict.fromkeys(name for _, name in CRASH_POINTS))
        terminalreporter.section("crash matrix: crash points per trajectory")
        header = f"  {'trajectory':<45} " + " ".join(f"{b:>7}" for b in backends)
        terminalreporter.write_line(header)
        for name in names:
            row = " ".join(f"{CRASH_POINTS.get((b, name), 0):>7}" for b in backends)
            terminalreporter.write_line(f"  {name:<45} {row}")
        total = sum(CRASH_POINTS.values())
        terminalreporter.write_line(f"  {total} crash points, each restored and resumed twice")
    if RACE_ORDERS:
        terminalreporter.section("race catalog: orders tested per row")

        def number(row: str) -> tuple[int, str]:
            head = row.split()[0]
            return (int(head), row) if head.isdigit() else (100, row)

        for row in sorted(RACE_ORDERS, key=number):
            terminalreporter.write_line(f"  {row}: {', '.join(sorted(RACE_ORDERS[row]))}")
