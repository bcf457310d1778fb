"""Worker ids name their process; a holder is gone only when this machine's kernel says so."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest

from gateway.incarnation import Incarnation, gone, new_worker_id, parse
from gateway.service import default_worker_id


def _named(pid: int) -> Incarnation:
    """The incarnation a worker in process `pid` (of this machine and namespace) would name."""
    own = parse(new_worker_id())
    assert own is not None, "this test needs /proc"
    with open(f"/proc/{pid}/stat") as stat:
        start = int(stat.read().rsplit(")", 1)[1].split()[19])
    return replace(own, pid=pid, start=start)


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    """A live process of this machine (killed and reaped at the end)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_worker_id_names_this_process() -> None:
    worker = default_worker_id()
    named = parse(worker)
    assert named is not None
    assert named.pid == os.getpid()
    assert named.worker_id == worker
    assert worker != default_worker_id()  # two services in one process never share an id
    assert not gone(worker)


# what a holder's id says -> gone? (False: alive, or nothing known: its lease runs out as ever)
CASES: dict[str, tuple[Callable[[Incarnation], str], bool]] = {
    "alive": (lambda p: p.worker_id, False),
    "alive, another service in it": (lambda p: replace(p, nonce="0badc0de").worker_id, False),
    "its pid reused by a later process": (lambda p: replace(p, start=p.start - 1).worker_id, True),
    "another machine or pid namespace": (lambda p: replace(p, space="0" * 12).worker_id, False),
    "an id of the old form (host-pid-random)": (lambda p: f"{p.host}-{p.pid}-{p.nonce}", False),
    "an id someone chose": (lambda p: "worker-1", False),
    "empty": (lambda p: "", False),
    "a space of another length": (lambda p: replace(p, space="abc").worker_id, False),
    "a pid that is not a number": (lambda p: p.worker_id.replace(f"-{p.pid}-", "-x1-"), False),
    "a host with dashes and dots, pid reused": (
        lambda p: replace(p, host="a-b.c-1", start=p.start + 1).worker_id,
        True,
    ),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_whether_a_holder_is_gone(child: subprocess.Popen[bytes], case: str) -> None:
    name, expected = CASES[case]
    assert gone(name(_named(child.pid))) is expected


def test_a_holder_whose_process_exited_is_gone_reaped_or_not() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    worker = _named(proc.pid).worker_id
    deadline = time.monotonic() + 10
    while not gone(worker):  # a zombie: it exited, its parent (this test) has not reaped it
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.wait()
    assert gone(worker)  # reaped: no such process
