"""``gateway ops``: the operator API (``/api/v1``) from the terminal.

Reads (``sessions``, ``lanes``, ``lane``, ``timeline``, ``usage``, ``backlog``, ``mcp``,
``deliveries``, ``audit``, ``action``) print tables for people or, with ``--json``, the API's
JSON; actions (``resume``, ``unstick``, ``abort``, ``rewind``, ``retry``, ``approve``,
``deny``, ``supply``, ``redeliver``, ``discard``) print one line each. A lane is named by its id
(``ln_...``), its name (``web:hello``, ``slack:C1:123.4``) or ``SESSION/LANE``.

Where and as whom: ``--url`` (else ``GATEWAY_OPS_URL``, else the address the embedded service
keeps beside its store while it runs, else the one in the settings ``gateway serve`` reads) and
``--token`` (else ``GATEWAY_OPS_TOKEN``, else the token the embedded service keeps beside its
store). Actions that change a lane say what they will do and
ask first; without a terminal they need ``--yes``. Every action carries an ``Idempotency-Key``
(``--idempotency-key`` to retry one safely).

Exit status: 0 done, 1 the gateway refused or failed, 2 a usage error (or a confirmation that
was needed), 3 the gateway could not be reached, 130 interrupted. Errors are one line on stderr.

The parts: `target` (where the gateway is and the token), `client` (the API over HTTP),
`run` (one command's output, lane names, confirmation), `output` (safe text, tables, times),
`reads` and `actions` (the commands), `parser` (the command line), `errors` (exit statuses).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Sequence

from config import Settings
from gateway.ops.cli.client import Client
from gateway.ops.cli.errors import FAILED, INTERRUPTED, OK, USAGE, OpsError
from gateway.ops.cli.output import clean
from gateway.ops.cli.parser import build_parser
from gateway.ops.cli.run import Handler, Run
from gateway.ops.cli.target import Target

__all__ = ["main"]


def main(argv: Sequence[str], settings: Settings | None = None) -> int:
    """Run ``gateway ops ARGV``; returns the exit status (`settings`: None loads them)."""
    try:
        try:
            parser = build_parser()
            parser.check_given(
                argv, ("--url", "--token", "--timeout", "--idempotency-key", "--config", "--store")
            )
            args = parser.parse_args(list(argv))
        except SystemExit as exc:  # --help (0) or a usage error (2), already printed
            return exc.code if isinstance(exc.code, int) else USAGE
        client: Client | None = None
        run: Run | None = None
        try:
            client = Client(Target(args, settings), args.timeout)
            handler: Handler = args.handler
            run = Run(args, client)
            status = _interruptible(lambda: handler(run))
        except KeyboardInterrupt:
            client = None  # its request may still be on its thread: the process ends instead
            if run is not None and run.key_sent is not None:
                # the action may have been taken: its key asks again without doing it twice
                _error(
                    "interrupted: the action may already have reached the gateway; the same "
                    f"command with --idempotency-key {run.key_sent} says what it did, and "
                    "does nothing twice",
                    prefix=False,
                )
                return INTERRUPTED
            raise
        finally:
            if client is not None:
                client.close()
        sys.stdout.flush()
        return status
    except OpsError as exc:
        _error(exc.message)
        return exc.status
    except KeyboardInterrupt:
        _error("interrupted", prefix=False)
        return INTERRUPTED
    except BrokenPipeError:  # the reader went away (| head): nothing more to say
        _quiet_stdout()
        return OK
    except Exception as exc:  # a bug or a surprising answer: one line all the same
        hint = ""
        if isinstance(exc, AttributeError | KeyError | TypeError | IndexError):
            # an answer of another shape than the API's (a server that is not the gateway)
            hint = " (an answer of another shape than the operator API's: is --url the gateway?)"
        _error(f"unexpected {type(exc).__name__}: {exc}{hint}")
        return FAILED


def _interruptible(command: Callable[[], int]) -> int:
    """Run `command` on a daemon thread and wait for it here, a tenth of a second at a time.

    CPython acts on a signal when a blocking call returns, and checks before it blocks only at
    its own pace: a Ctrl-C landing just before the main thread blocks in a socket read waited
    for the read's whole timeout (30 s by default; seen about once in thirty tries on a busy
    machine). Waiting here in short steps bounds that to one step; the thread, abandoned on
    Ctrl-C, ends with the process.
    """
    outcome: list[tuple[int | None, BaseException | None]] = []
    done = threading.Event()

    def run() -> None:
        try:
            outcome.append((command(), None))
        except BaseException as exc:  # raised again on the main thread, whatever it is
            outcome.append((None, exc))
        finally:
            done.set()

    threading.Thread(target=run, name="gateway-ops", daemon=True).start()
    while not done.wait(0.1):
        pass
    status, raised = outcome[0]
    if raised is not None:
        raise raised
    assert status is not None
    return status


def _error(message: str, *, prefix: bool = True) -> None:
    try:
        sys.stdout.flush()
    except (BrokenPipeError, OSError, ValueError):
        _quiet_stdout()
    try:
        sys.stderr.write(("gateway ops: " if prefix else "") + clean(message) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so nothing fails again when Python flushes it at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
