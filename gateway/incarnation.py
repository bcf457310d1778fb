"""Worker ids that name their process, and whether the process a worker id names is gone.

A worker id is ``<host>-<pid>-<random>.<space>.<start>``: `space` stands for this kernel boot
and this process's pid namespace (a hash of the boot id and the namespace's id: the processes
whose pids it sees), `start` is the process's start time (clock ticks since boot) and the
random part keeps two services in one process apart. A worker that died holding leases and
tickets is *gone* for an asker in the same space (the same kernel since boot, the same view of
pids) when no process with that pid and start time runs there: the kernel says so, so its
leases may be taken at once instead of after they run out (D159).

Nothing is known of a holder in another space (another machine, another container's pid
namespace, a system without ``/proc``), of one whose process is hidden from the asker, or of an
id of another form: such a holder's leases run out as usual.
"""

from __future__ import annotations

import hashlib
import os
import random
import socket
from dataclasses import dataclass
from functools import cache
from pathlib import Path

__all__ = ["Incarnation", "gone", "new_worker_id", "parse"]

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_SPACE_HEX = 12
"""48 bits: two spaces of one store taken for one is not a practical risk."""


@dataclass(frozen=True, slots=True)
class Incarnation:
    """What a worker id says of its process."""

    host: str
    pid: int
    nonce: str
    space: str
    start: int

    @property
    def worker_id(self) -> str:
        """The worker id naming this incarnation."""
        return f"{self.host}-{self.pid}-{self.nonce}.{self.space}.{self.start}"


@cache
def _space() -> str | None:
    """This process's space: its kernel boot and pid namespace (None without ``/proc``)."""
    try:
        boot = _BOOT_ID.read_text().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    digest = hashlib.sha256(f"{boot} {namespace}".encode()).hexdigest()
    return digest[:_SPACE_HEX]


def _stat(pid: int) -> tuple[str, int] | None:
    """A process's state letter and start time, or None if it cannot be read."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        fields = text.rsplit(")", 1)[1].split()  # the name may hold spaces and parentheses
        return fields[0], int(fields[19])  # fields 3 and 22 of proc(5)
    except (OSError, IndexError, ValueError):
        return None


def new_worker_id(rng: random.Random | None = None) -> str:
    """A worker id that is new per process incarnation (a restarted process never shares one).

    Where the process's space is unknown (no ``/proc``) the id is ``<host>-<pid>-<random>``:
    nobody will ever find it gone.
    """
    host = socket.gethostname()
    pid = os.getpid()
    nonce = f"{(rng or random).getrandbits(32):08x}"
    space = _space()
    own = _stat(pid)
    if space is None or own is None:
        return f"{host}-{pid}-{nonce}"
    return Incarnation(host, pid, nonce, space, own[1]).worker_id


def parse(worker_id: str) -> Incarnation | None:
    """What `worker_id` says of its process, or None if it is not of `new_worker_id`'s form."""
    host, _, rest = worker_id.rpartition("-")
    host, _, pid = host.rpartition("-")
    parts = rest.split(".")
    if not host or not (pid.isascii() and pid.isdigit()) or len(parts) != 3:
        return None
    nonce, space, start = parts
    if len(space) != _SPACE_HEX or not (start.isascii() and start.isdigit()) or not nonce:
        return None
    return Incarnation(host, int(pid), nonce, space, int(start))


def gone(worker_id: str) -> bool:
    """Whether the process `worker_id` names is known to run no more (False: alive or unknown).

    True only in this process's own space, when the kernel has no process of that pid, or one
    that started at another time (the pid was reused), or a zombie (it exited; its parent has
    not reaped it yet).
    """
    named = parse(worker_id)
    if named is None or named.space != _space():
        return False
    try:
        os.kill(named.pid, 0)  # not hidden by /proc's hidepid: the kernel's own answer
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # it exists (another user's)
    except OSError:
        return False
    found = _stat(named.pid)
    if found is None:
        return False  # hidden, or it died just now: unknown this time
    state, start = found
    return start != named.start or state in ("Z", "X")
