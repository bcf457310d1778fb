"""A stdio MCP server dies with the gateway that spawned it, even one that ignores its input.

A server whose gateway is SIGKILLed (an OOM kill, a deploy's deadline, a crash) is told only
by its input closing; one that does not exit then (a Node server with a timer, a wrapper
script) runs on, an orphan, and every restart of the gateway adds one. On Linux the server is
started through a few lines of Python, the leader of the server's own process group, that ask
the kernel for a signal when the gateway dies (``PR_SET_PDEATHSIG``), start the server as
their child, and wait for it, exiting as it exits. At the gateway's death they kill the whole
group: the server, and whatever it started (a wrapper script's ``sh -c``, ``npx`` or ``uvx``
runs the real server as a child, which a signal to the wrapper alone left running: an outside
probe, D374). They hold none of the server's pipes, so the server's closing its output is
seen as before. Elsewhere the command runs as it is.

The program is looked up before the spawn as the spawn itself would (``PATH`` from the
server's environment; a path with a slash from its ``cwd``): a program that is not there is
still a `FileNotFoundError` of the start, which gives the server up, not a crash after it.
"""

from __future__ import annotations

import errno
import os
import shutil
import sys
from collections.abc import Mapping, Sequence

__all__ = ["LEASHED", "leashed"]

LEASHED = sys.platform == "linux"
"""Whether servers are started on a leash here (``prctl`` is Linux's)."""

_LEASH = """\
import ctypes, os, signal, sys
def gone(number, frame):
    os.killpg(0, signal.SIGKILL)  # the gateway died: the whole group goes, this one too
signal.signal(signal.SIGUSR2, gone)
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGUSR2, 0, 0, 0)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    os._exit(1)  # the gateway died before the leash was on: nobody is there to serve
child = os.fork()
if child == 0:
    signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    try:
        os.execvp(sys.argv[2], sys.argv[2:])
    except OSError as exc:
        sys.stderr.write(f"cannot start {sys.argv[2]!r}: {exc}\\n")
        os._exit(127)
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a stop's SIGTERM is the server's to answer
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)  # the pipes are the server's alone: its closing them is seen
while True:
    try:
        _, status = os.waitpid(child, 0)
        break
    except ChildProcessError:
        os._exit(0)
    except InterruptedError:
        continue
os._exit(os.waitstatus_to_exitcode(status) % 256)
"""
"""Runs in the child: ``argv`` is the gateway's pid, then the server's command and args."""


def leashed(
    command: str, args: Sequence[str], env: Mapping[str, str], cwd: str | None
) -> tuple[str, list[str]]:
    """The command and arguments that start `command` on a leash (where `LEASHED`).

    Raises:
        FileNotFoundError: `command` is not found where the spawn would look.
        PermissionError: it is there but not executable.
    """
    if not LEASHED:
        return command, list(args)
    _findable(command, env.get("PATH", os.defpath), cwd)
    # -I: the server's PYTHON* variables are its own, not the leash's; -S: no site to import
    return sys.executable, ["-I", "-S", "-c", _LEASH, str(os.getpid()), command, *args]


def _findable(command: str, path: str, cwd: str | None) -> None:
    if "/" in command:
        where = command if os.path.isabs(command) else os.path.join(cwd or os.getcwd(), command)
        if not os.path.exists(where):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), command)
        if os.path.isdir(where) or not os.access(where, os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), command)
        return
    if shutil.which(command, path=path) is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), command)
