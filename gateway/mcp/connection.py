"""One MCP server: connect (spawn or reach), list its tools, call them, restart it when it fails.

A supervisor task owns the SDK client (its task group lives in that task): it connects
within ``start_timeout_seconds``, lists the tools (every page), then waits for the connection
to end (the stdio server's output closing, a call that finds it gone, or a ping of an idle
HTTP server that fails) or for ``notifications/tools/list_changed`` (a re-list). A lost
connection is retried after a backoff that doubles up to a cap; a server that cannot be
spawned at all (no such program) is ``failed``; a refused HTTP request names its status. A
call never raises: a server that is down, a vanished tool, a timeout, an abort, a crash
mid-call and a malformed result each become an error result the model reads, and cancelling
a call (timeout, abort, stop) sends the protocol's ``notifications/cancelled`` (the SDK does
it when the awaiting task is cancelled). The idempotency key rides in the request's
``_meta`` under `IDEMPOTENCY_META_KEY` (D201).
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import json
import logging
import math
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast

import anyio
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.stdio import get_default_environment
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import (
    CONNECTION_CLOSED,
    HEADER_MISMATCH,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    PARSE_ERROR,
    UNSUPPORTED_PROTOCOL_VERSION,
    URL_ELICITATION_REQUIRED,
)
from pydantic import ValidationError

from gateway.errors import GatewayError
from gateway.logs import event
from gateway.mcp.health import McpServerHealth, ServerState
from gateway.mcp.http_bodies import BoundedBodies
from gateway.mcp.leash import leashed
from gateway.mcp.results import malformed, redacted, to_output
from gateway.mcp.settings import McpServer
from gateway.mcp.stderr import StderrTail
from gateway.mcp.stdio import (
    MAX_MESSAGE_BYTES,
    TOO_LARGE_CODE,
    TOO_LARGE_DATA,
    StopBy,
    bound_blocks,
    bounded_stdio,
)
from harness_core.clock import Clock
from harness_core.tools import ToolOutput

__all__ = [
    "IDEMPOTENCY_META_KEY",
    "MAX_TOOLS",
    "PING_EVERY_S",
    "Backoff",
    "CallObserver",
    "McpConnection",
]

IDEMPOTENCY_META_KEY = "durable-gateway/idempotency-key"
"""The ``_meta`` key of a call's idempotency key (stable across every replay of the call)."""
MAX_PAGES = 100
"""The most ``tools/list`` pages read: a server whose cursor never ends cannot hang a start."""
MAX_TOOLS = 1_000
"""The most tools one server's list is read to: 200,000 tools of a cursor that never ended
took 18 s and 794 MB, and every run's start record named them all (an outside probe)."""
PING_EVERY_S = 30.0
"""How often an idle Streamable HTTP server is pinged: nothing else shows that it went away."""
_MAY_HAVE_HAPPENED = "the call may have had its effect"

log = logging.getLogger("gateway.mcp")

Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Backoff:
    """How long to wait before restarting a failed server: doubling from `first_s` to `max_s`."""

    first_s: float = 1.0
    max_s: float = 60.0

    def delay(self, failures: int) -> float:
        """The wait after `failures` consecutive failures (1 or more)."""
        return float(min(self.max_s, self.first_s * 2 ** max(0, failures - 1)))


class CallObserver(Protocol):
    """What the connection reports (the service's metrics)."""

    def mcp_call(self, server: str, outcome: str) -> None:
        """A call ended: ok, error (isError), timeout, aborted, down, crashed, malformed..."""

    def mcp_restart(self, server: str) -> None:
        """A connection attempt after a failure."""

    def mcp_state(self, server: str, up: bool) -> None:
        """The server came up (ready) or went down."""


class _Refused(GatewayError):
    """The server's answer breaks the protocol (the message says where)."""


class _Lost(GatewayError):
    """The connection ended (the server exited or a call found it gone)."""


_NO_SUCH_TOOL = (
    "this override applies to nothing: the server lists no tool of that name (overrides name "
    "its own tools, as `ops mcp --tools` shows them after the server's prefix)"
)
_NOTHING_MATCHES = "the server lists no tool this name or pattern matches"

_SESSION_REFUSED = frozenset({401, 404})
"""HTTP answers to a call that end the session rather than the call: a server that restarted
forgot the session id (404, as the MCP transport specifies), or the credentials changed. A 403
is one request's (an OAuth scope that tool needs): the session, and the calls in flight on it,
go on."""
_NOT_RUN = frozenset(
    {
        PARSE_ERROR,
        INVALID_REQUEST,
        METHOD_NOT_FOUND,
        INVALID_PARAMS,
        HEADER_MISMATCH,
        UNSUPPORTED_PROTOCOL_VERSION,
        MISSING_REQUIRED_CLIENT_CAPABILITY,
        URL_ELICITATION_REQUIRED,
    }
)
"""JSON-RPC errors a server answers before it runs anything (the request could not be read, or
names no method or no valid arguments). Any other error of a call (an internal error, an HTTP
5xx the SDK reads as one, a server's own code) may come after the tool did its work."""


class McpConnection:
    """One configured server's connection, tools and health (see the module docstring)."""

    def __init__(
        self,
        server: McpServer,
        *,
        clock: Clock,
        redact: Callable[[str], str],
        observer: CallObserver | None = None,
        backoff: Backoff = Backoff(),
        sleep: Sleep = asyncio.sleep,
        ping_every_s: float = PING_EVERY_S,
    ) -> None:
        self.server = server
        self.name = server.name
        self._clock = clock
        self._redact = redact
        self._observer = observer
        self._backoff = backoff
        self._sleep = sleep
        self._ping_every_s = ping_every_s
        self._client: Client | None = None
        self._tools: dict[str, types.Tool] = {}
        self._state: ServerState = "starting"
        self._since_ms = clock.now_ms()
        self._retry_at_ms: int | None = None
        self._last_error: str | None = None
        self._stderr: str | None = None
        """The end of what a stdio server wrote to stderr before it last went down (redacted)."""
        self._tail: StderrTail | None = None
        """The current attempt's stderr reader."""
        self._restarts = 0
        self._calls = 0
        self._failures = 0
        self._lost = asyncio.Event()
        self._garbled = 0
        """Messages from the server that were no JSON-RPC (a stray print, a broken answer)."""
        self._garbled_why = ""
        self._listed: Any = None
        """The last ``tools/list`` answer as it came (for naming the tool a fault is in)."""
        self._relist = asyncio.Event()
        self._settled = asyncio.Event()
        self._calls_running: set[asyncio.Task[Any]] = set()
        self._stop_by = StopBy()
        self._supervisor: asyncio.Task[None] | None = None
        self._scope = anyio.CancelScope()
        """The supervisor's whole life: `close` cancels this, never the task (see `close`)."""
        self._version = 0
        self._warned: set[tuple[str, str]] = set()
        """The overrides and tools patterns already said to name no tool (said once each)."""
        self._up = False
        self._http_status: int | None = None
        """The last HTTP error status this attempt's requests got (the SDK keeps it to itself)."""
        self._unsent: dict[str, str] = {}
        """The calls (by idempotency key) whose HTTP request could not even connect: why."""
        self.on_change: Callable[[], None] | None = None
        """Called when the tool list changes (the source rebuilds its tools)."""

    # -- what it shows ---------------------------------------------------------------------

    @property
    def state(self) -> ServerState:
        """Where it is now (starting, ready, restarting, failed, stopped)."""
        return self._state

    def tools(self) -> Mapping[str, types.Tool]:
        """Its exposed tools by their own names (the last listed; kept while it restarts)."""
        return dict(self._tools)

    def health(self) -> McpServerHealth:
        """What the operator sees (no secret: the error text went through the redactor)."""
        return McpServerHealth(
            name=self.name,
            transport=self.server.transport,
            target=self.server.target,
            state=self._state,
            trusted=self.server.trusted,
            tools=tuple(f"{self.name}.{tool}" for tool in self._tools),
            restarts=self._restarts,
            calls=self._calls,
            failures=self._failures,
            last_error=self._last_error,
            stderr=self._stderr,
            since_ms=self._since_ms,
            retry_at_ms=self._retry_at_ms if self._state == "restarting" else None,
        )

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the supervisor; returns once the first attempt settled (up, or failed)."""
        if self._supervisor is None:
            self._supervisor = asyncio.create_task(self._supervise(), name=f"mcp:{self.name}")
        await self._settled.wait()

    async def close(self, within: float | None = None) -> None:
        """Cancel the calls in flight (``notifications/cancelled``), stop the server.

        `within`: the seconds the close may take (the gateway's stop has a budget); a stdio
        server's waits to exit on its own are shortened to fit, and then it is killed.
        """
        if within is not None:
            self._stop_by.at = anyio.current_time() + within
        for task in list(self._calls_running):
            task.cancel()
        if self._calls_running:
            await asyncio.wait(list(self._calls_running), timeout=within)
        if self._supervisor is not None:
            # An anyio cancel, not Task.cancel(): it waits out the SDK's shielded transport
            # shutdown (close stdin, wait, kill, close the transport) where a native cancel
            # would cut it short and leave the server process running (D202).
            self._scope.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        self._tools = {}
        self._set_state("stopped")
        self._settled.set()

    async def _supervise(self) -> None:
        try:
            with self._scope:
                await self._supervise_in_scope()
        finally:
            if self._tail is not None:
                self._tail.close()

    async def _supervise_in_scope(self) -> None:
        failures = 0
        while True:
            self._up = False
            try:
                await self._connect_once()  # returns only by raising
            except _Lost as exc:
                self._fault(str(exc) or "the connection ended")
                await self._heard()
            except Exception as exc:  # any failure of a foreign server or its transport
                self._fault(self._explain(exc))
                await self._heard()
                if _spawn_failed(exc) and not self._up:
                    # "FileNotFoundError: [Errno 2] No such file or directory" named no program
                    # (nor, when it was the working directory that is missing, that)
                    cwd = self.server.cwd
                    if cwd is not None and not await asyncio.to_thread(os.path.isdir, cwd):
                        self._fault(
                            f"cannot start in {cwd!r}{_from_here(cwd)}: no such directory (its cwd)"
                        )
                    else:
                        command = self.server.command or ""
                        where = _from_here(command, cwd) if "/" in command else ""
                        hint = (
                            " (a command with its arguments? the program goes in `command`, "
                            "each argument in `args`)"
                            if " " in command.strip()
                            else ""
                        )
                        self._fault(f"cannot start {command!r}{where}: {self._last_error}{hint}")
                    self._give_up()
                    return
            failures = 1 if self._up else failures + 1
            delay = self._backoff.delay(failures)
            self._retry_at_ms = self._clock.now_ms() + int(delay * 1000)
            self._set_state("restarting")
            self._settled.set()
            log.warning(
                event(
                    "mcp.server_down",
                    server=self.name,
                    error=self._last_error,
                    stderr=self._stderr,
                    retry_in_s=round(delay, 3),
                )
            )
            await self._sleep(delay)
            self._restarts += 1
            if self._observer is not None:
                self._observer.mcp_restart(self.name)

    def _give_up(self) -> None:
        self._tools = {}
        self._set_state("failed")
        self._settled.set()
        self._changed()
        log.error(
            event(
                "mcp.server_failed", server=self.name, error=self._last_error, stderr=self._stderr
            )
        )

    async def _heard(self) -> None:
        """Keep the end of what the attempt's server wrote to stderr (when it wrote anything)."""
        tail, self._tail = self._tail, None
        said = await tail.finish() if tail is not None else None
        if said is not None:
            self._stderr = self._redact(said)

    async def _connect_once(self) -> None:
        self._lost = asyncio.Event()
        self._relist = asyncio.Event()
        self._http_status = None
        # anyio's deadline, like `close`, waits out the SDK's shielded shutdown (D202); it
        # encloses the client (whose task groups must exit inside it) and is lifted once up
        with anyio.CancelScope(
            deadline=anyio.current_time() + self.server.start_timeout_seconds
        ) as starting:
            await self._connected(starting)
        raise TimeoutError  # the deadline cut the start (`_connected` only returns by raising)

    async def _connected(self, starting: anyio.CancelScope) -> None:
        async with contextlib.AsyncExitStack() as stack:
            client = Client(
                await self._transport(stack),
                mode="legacy",  # the initialize handshake every deployed server speaks (D200)
                cache=None,  # a listing is always fetched: list_changed must be seen
                message_handler=self._on_message,
                client_info=types.Implementation(name="durable-gateway", version="1"),
            )
            await stack.enter_async_context(client)
            await self._list(client)
            starting.deadline = math.inf
            self._client = client
            self._up = True
            self._set_state("ready")
            self._settled.set()
            log.info(event("mcp.server_ready", server=self.name, tools=len(self._tools)))
            # a stdio server's end is seen (its output closes); an HTTP server's only when a
            # request fails, so an idle one is pinged
            pinged = self.server.transport == "http"
            try:
                while True:
                    waits = [self._lost.wait(), self._relist.wait()]
                    await _first(*waits, *([asyncio.sleep(self._ping_every_s)] if pinged else []))
                    if self._lost.is_set():
                        raise _Lost(self._last_error or "the connection ended")
                    with anyio.fail_after(self.server.start_timeout_seconds):
                        if not self._relist.is_set():
                            # a call in flight tells whether the server is there; a ping a
                            # busy server answers late would cut that call (D200's "idle")
                            if not self._calls_running:
                                # the session's ping: `Client.send_ping` warns that the
                                # 2026-07-28 protocol drops it (legacy mode keeps it): a
                                # warning in the log, and an error under the tests
                                await client.session.send_ping()
                            continue
                        self._relist.clear()
                        await self._list(client)
                    log.info(event("mcp.tools_changed", server=self.name, tools=len(self._tools)))
            finally:
                self._client = None

    async def _transport(self, stack: contextlib.AsyncExitStack) -> Any:
        server = self.server
        lost = self._lost
        if server.command is not None:
            env = {k: v.get_secret_value() for k, v in server.env.items()}
            # dies with this process, even if it ignores its input closing (an orphan after a
            # SIGKILL otherwise, one more per restart)
            command, args = leashed(
                server.command, server.args, get_default_environment() | env, server.cwd
            )
            # the server's stderr is not ours to print (it may echo the secrets it was given),
            # but its end says why it stopped: kept for the operator (`health`), redacted
            self._tail = StderrTail(self._redact)
            errlog = stack.enter_context(await self._tail.open())
            # the SDK's own stdio reader costs time quadratic in a line's length, unbounded
            spawned = bounded_stdio(
                command,
                args,
                env=get_default_environment() | env,
                cwd=server.cwd,
                errlog=errlog,
                stop_by=self._stop_by,
            )
            return _watched(spawned, lost, garbled=self._garble, heard=self._heard_answer)
        assert server.url is not None  # validated
        headers = {k: v.get_secret_value() for k, v in server.headers.items()}
        if server.bearer_token is not None:
            headers["Authorization"] = f"Bearer {server.bearer_token.get_secret_value()}"

        async def seen(response: httpx2.Response) -> None:
            # a 405 to the GET of the optional event stream is the server saying it has none
            # (the Streamable HTTP spec allows it): every later fault was blamed on that 405
            optional = response.request.method == "GET" and response.status_code == 405
            if response.status_code >= 400 and not optional:
                self._http_status = response.status_code

        http = httpx2.AsyncClient(
            transport=_NotesUnsent(BoundedBodies(httpx2.AsyncHTTPTransport()), self._unsent),
            headers=headers,
            timeout=httpx2.Timeout(30.0, read=server.call_timeout_seconds + 30.0),
            event_hooks={"response": [seen]},
        )
        return _watched(
            # events are bounded by the transport (`BoundedBodies`), as a stdio line is: the
            # SDK's own limit of 1 MiB failed every call whose answer came as a larger event
            streamable_http_client(
                server.url, http_client=http, max_sse_event_size=2 * MAX_MESSAGE_BYTES
            ),
            lost,
            http,
            garbled=self._garble,
            heard=self._heard_answer,
        )

    async def _list(self, client: Client) -> None:
        found: dict[str, types.Tool] = {}
        listed: set[str] = set()
        twice: set[str] = set()
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            try:
                page = await client.list_tools(cursor=cursor, cache_mode="refresh")
            except ValidationError as exc:
                # the SDK refuses the whole page for one bad tool, as the official clients do;
                # the health names that tool rather than "1 validation error for ..."
                fault = _first_fault(exc, self._listed)
                raise _Refused(f"its tool list breaks the protocol: {fault}") from None
            for tool in page.tools:
                if tool.name in listed:  # the first is kept: a later one replaced it, silently
                    twice.add(tool.name)
                    continue
                listed.add(tool.name)
                if self._exposed(tool.name) and len(found) < MAX_TOOLS:
                    found[tool.name] = tool
            cursor = page.next_cursor
            if not cursor or len(listed) > MAX_TOOLS:
                break
        if len(listed) > MAX_TOOLS:
            said = (
                f"it lists more than {MAX_TOOLS:,} tools: only the first {len(found):,} it "
                "exposes are offered (its own tool filter, or `tools`, chooses which)"
            )
            self._fault(said)
            log.warning(event("mcp.tools_cut", server=self.name, note=said))
        if twice:
            log.warning(
                event(
                    "mcp.tool_listed_twice",
                    server=self.name,
                    tools=sorted(self._redact(name)[:80] for name in twice)[:20],
                    note="the first of each is offered, with its declarations",
                )
            )
        self._warn_unmatched(listed)
        changed = found != self._tools
        self._tools = found
        if changed:
            self._changed()

    def _warn_unmatched(self, listed: set[str]) -> None:
        """Say, once each, which override and which tools pattern names none of its tools.

        A typo there is a policy not applied: an approval asked for and skipped, a tool meant
        to be hidden offered.
        """
        server = self.server
        unmatched = [
            ("mcp.override_names_no_tool", "tool", key, _NO_SUCH_TOOL)
            for key in server.overrides
            if key not in listed
        ] + [
            ("mcp.tools_pattern_matches_nothing", "pattern", pattern, _NOTHING_MATCHES)
            for pattern in server.tools
            if not any(fnmatch.fnmatchcase(name, pattern) for name in listed)
        ]
        for name, field, value, note in unmatched:
            if (name, value) not in self._warned:
                self._warned.add((name, value))
                log.warning(event(name, server=self.name, note=note, **{field: value}))

    def _exposed(self, name: str) -> bool:
        override = self.server.overrides.get(name)
        if override is not None and override.disabled:
            return False
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self.server.tools)

    async def _on_message(self, message: types.ServerNotification | Exception) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self._relist.set()

    def _changed(self) -> None:
        self._version += 1
        if self.on_change is not None:
            self.on_change()

    def _set_state(self, state: ServerState) -> None:
        if state == self._state:
            return
        was_up = self._state == "ready"
        self._state = state
        self._since_ms = self._clock.now_ms()
        if self._observer is not None and (state == "ready") != was_up:
            self._observer.mcp_state(self.name, state == "ready")

    def _explain(self, exc: BaseException) -> str:
        """`_describe`, with the HTTP status the server answered when it refused a request."""
        status = self._http_status
        if status is None:
            return _describe(exc)
        said = f"the server answered HTTP {status} {httpx2.codes.get_reason_phrase(status)}"
        if status in (401, 403):
            return f"{said}: check the server's bearer_token or headers"
        return f"{said} ({_describe(exc)})"

    def _fault(self, text: str) -> None:
        self._last_error = self._redact(text)[:500]

    # -- calls -----------------------------------------------------------------------------

    async def call(
        self, tool: str, arguments: Mapping[str, Any], *, key: str, abort: asyncio.Event
    ) -> ToolOutput:
        """Call `tool` (its own name); never raises but `CancelledError` (see the module doc)."""
        self._calls += 1
        client = self._client
        if client is None or self._state != "ready" or self._lost.is_set():
            return self._ended("down", self._down_text())
        if tool not in self._tools:
            return self._ended(
                "unknown", f"MCP server {self.name!r} does not offer {tool!r} any more", fault=False
            )
        self._http_status = None  # what this call's requests are answered, if they fail
        garbled = self._garbled  # a broken answer meanwhile is said at a timeout, not "none"
        work = asyncio.ensure_future(client.call_tool(tool, dict(arguments), meta=_meta(key)))
        self._calls_running.add(work)
        stop = asyncio.ensure_future(abort.wait())
        try:
            done, _ = await asyncio.wait(
                {work, stop},
                timeout=self.server.call_timeout_seconds,
                return_when=asyncio.FIRST_COMPLETED,
            )
        except asyncio.CancelledError:
            await _cancel(work)  # the lane itself was cancelled: tell the server, then go
            raise
        finally:
            stop.cancel()
            self._calls_running.discard(work)
        if work not in done:
            await _cancel(work)
            if abort.is_set():
                return self._ended(
                    "aborted", f"the call was cancelled: the run was aborted; {_MAY_HAVE_HAPPENED}"
                )
            if self._garbled > garbled:
                self._failures += 1
                self._report("malformed")
                return malformed(
                    self.name,
                    tool,
                    f"it wrote something that is no JSON-RPC message ({self._garbled_why}) "
                    f"and no answer within {self.server.call_timeout_seconds:g} s: the call "
                    "was cancelled",
                )
            return self._ended(
                "timeout",
                f"MCP server {self.name!r} did not answer {tool!r} within "
                f"{self.server.call_timeout_seconds:g} s: the call was cancelled; "
                f"{_MAY_HAVE_HAPPENED}",
            )
        return self._settle(work, tool, key)

    def _settle(self, work: asyncio.Future[Any], tool: str, key: str) -> ToolOutput:
        unsent = self._unsent.pop(key, None)
        try:
            result = work.result()
        except asyncio.CancelledError:
            return self._ended(
                "stopped",
                f"the call was cancelled: the connection to MCP server {self.name!r} was "
                f"closed; {_MAY_HAVE_HAPPENED}",
            )
        except ValidationError as exc:
            self._failures += 1
            self._report("malformed")
            return malformed(self.name, tool, f"{exc.error_count()} validation errors")
        except (RuntimeError, RecursionError) as exc:
            if isinstance(exc, RuntimeError) and not _OUTPUT_CHECK.match(str(exc)):
                return self._crashed(tool, exc)
            # the server answered, and the SDK's check of the answer against the tool's own
            # output schema failed: that answer is malformed; the connection is fine
            self._failures += 1
            self._report("malformed")
            return malformed(self.name, tool, self._redact(_describe(exc))[:500])
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED and str(exc) == _SDK_CLOSED:
                if unsent is not None:
                    return self._unreached(tool, unsent)
                return self._crashed(tool, exc)
            if exc.code == TOO_LARGE_CODE and exc.data == TOO_LARGE_DATA:  # said by the gateway
                return self._ended(
                    "too_large",
                    f"MCP server {self.name!r} ran {tool!r}, but {exc.error.message}: ask it "
                    "for less (a narrower query, a smaller range); the call was made",
                    fault=False,
                )
            status = self._http_status
            if self.server.transport == "http" and status == 403:
                return self._ended(  # this request's refusal: the session goes on
                    "error",
                    f"MCP server {self.name!r} refused {tool!r} ({self._explain(exc)}); the "
                    "call was not made",
                    fault=False,
                )
            if self.server.transport == "http" and status in _SESSION_REFUSED:
                # its session is gone (the server restarted: 404) or its credentials are
                # (401/403): every later call would be refused the same way until the idle
                # ping, 30 s on; the connection is made again now, and health says why
                self._fault(self._explain(exc))
                self._lost.set()
                return self._ended(
                    "error",
                    f"MCP server {self.name!r} refused {tool!r} ({self._last_error}); the "
                    "call was not made, and the connection is made again: try again shortly",
                )
            if exc.code in _NOT_RUN:
                return self._ended(
                    "error",
                    self._redact(f"MCP server {self.name!r} refused {tool!r}: {exc}")[:2000],
                    fault=False,
                )
            # -32000 is also the code of one call whose answer an HTTP stream lost; a -32603
            # came after a card was charged, an HTTP 504 from a proxy while the server went on
            # (an outside probe): that call's outcome is unknown, the connection is fine
            return self._ended(
                "error",
                self._redact(
                    f"MCP server {self.name!r} did not complete {tool!r}: {exc}; "
                    f"{_MAY_HAVE_HAPPENED}"
                )[:2000],
                fault=False,
            )
        except Exception as exc:
            return self._crashed(tool, exc)
        output = redacted(
            to_output(result, server=self.name, tool=tool, max_chars=self.server.max_output_chars),
            self._redact,
        )
        self._report("error" if output.is_error else "ok")
        return output

    def _heard_answer(self, message: Any) -> None:
        """Keep a ``tools/list`` answer as it came (a fault deep in a tool names its index).

        A result of too many content blocks is bounded first (`bound_blocks`): an HTTP
        server's too, whose answers the SDK reads itself.
        """
        bound_blocks(message)
        result = getattr(message, "result", None)
        if isinstance(result, dict) and isinstance(result.get("tools"), list):
            self._listed = result["tools"]

    def _garble(self, exc: Exception) -> None:
        """The server wrote something the SDK could not read as a message (it says whose)."""
        self._garbled += 1
        self._garbled_why = self._redact(_describe(exc))[:200]
        if self._garbled == 1 or self._garbled % 100 == 0:
            log.warning(
                event(
                    "mcp.unreadable_message",
                    server=self.name,
                    count=self._garbled,
                    reason=self._garbled_why,
                )
            )

    def _unreached(self, tool: str, why: str) -> ToolOutput:
        """The call's request never connected: it was not made (the server is reached again)."""
        return self._cut(
            "down",
            f"could not be reached ({why})",
            f"MCP server {self.name!r} could not be reached ({why}): the call of {tool!r} was "
            "not made; the connection is made again: try again shortly",
        )

    def _crashed(self, tool: str, exc: BaseException) -> ToolOutput:
        said = _describe(exc)
        if self.server.transport == "http" and said == _CLOSED_WORDS:
            said = "the connection closed"  # no process of ours: it was made again, or cut
        return self._cut(
            "crashed",
            f"during a call of {tool!r}: {said}",
            f"the connection to MCP server {self.name!r} was lost during the call "
            f"({said}); it is restarted; {_MAY_HAVE_HAPPENED}",
        )

    def _cut(self, outcome: str, fault: str, text: str) -> ToolOutput:
        """The connection is gone (health says `fault`), and the call ends saying `text`."""
        self._fault(fault)
        self._lost.set()
        return self._ended(outcome, text)

    def _down_text(self) -> str:
        why = f" ({self._last_error})" if self._last_error else ""
        if self._state == "restarting" and self._retry_at_ms is not None:
            left = max(0.0, (self._retry_at_ms - self._clock.now_ms()) / 1000)
            return (
                f"MCP server {self.name!r} is down{why}; it is restarted in {left:.0f} s: "
                "try again later"
            )
        # lost a moment ago, not yet marked so: "is ready (the connection ended)" contradicted
        # itself in a reply (an outside probe)
        state = "down" if self._state == "ready" else self._state
        return f"MCP server {self.name!r} is {state}{why}: its tools cannot be called"

    def _ended(self, outcome: str, text: str, *, fault: bool = True) -> ToolOutput:
        if fault and outcome not in ("down", "aborted", "stopped"):
            self._failures += 1
        self._report(outcome)
        return ToolOutput.text(self._redact(text), is_error=True)

    def _report(self, outcome: str) -> None:
        if self._observer is not None:
            self._observer.mcp_call(self.name, outcome)
        level = logging.INFO if outcome in ("ok", "error") else logging.WARNING
        log.log(level, event("mcp.call", server=self.name, outcome=outcome))


@contextlib.asynccontextmanager
async def _watched(
    inner: contextlib.AbstractAsyncContextManager[Any],
    lost: asyncio.Event,
    http: httpx2.AsyncClient | None = None,
    *,
    garbled: Callable[[Exception], None],
    heard: Callable[[Any], None],
) -> AsyncIterator[Any]:
    """A transport whose read side sets `lost` when it ends (the server went away).

    Each message it could not read (the SDK passes those on as exceptions) goes to `garbled`,
    each JSON-RPC message it read to `heard`.
    """
    async with contextlib.AsyncExitStack() as stack:
        if http is not None:
            await stack.enter_async_context(http)
        read, write = await stack.enter_async_context(inner)
        yield _WatchedRead(read, lost, garbled, heard), write


class _WatchedRead:
    """A read stream that sets an event at its end; everything else is the wrapped stream's."""

    def __init__(
        self,
        inner: Any,
        lost: asyncio.Event,
        garbled: Callable[[Exception], None],
        heard: Callable[[Any], None],
    ) -> None:
        self._inner = inner
        self._lost = lost
        self._garbled = garbled
        self._heard = heard

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)  # last_context, for the dispatcher

    def _seen(self, item: Any) -> Any:
        if isinstance(item, Exception):
            self._garbled(item)
        else:
            self._heard(getattr(item, "message", None))
        return item

    async def receive(self) -> Any:
        try:
            return self._seen(await self._inner.receive())
        except Exception:
            self._lost.set()
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> _WatchedRead:
        return self

    async def __anext__(self) -> Any:
        try:
            return self._seen(await self._inner.__anext__())
        except StopAsyncIteration:
            self._lost.set()
            raise
        except Exception:
            self._lost.set()
            raise

    async def __aenter__(self) -> _WatchedRead:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        result: bool | None = await self._inner.__aexit__(*exc)
        return result


class _NotesUnsent(httpx2.AsyncBaseTransport):
    """An HTTP transport that notes each tool call whose request could not even connect.

    Such a call never reached the server, so it was not made; the SDK ends the whole
    connection on it and its caller reads only "Connection closed", the words of a call that
    was cut mid-way. The call is known by the idempotency key in its request's ``_meta``.
    """

    def __init__(self, inner: httpx2.AsyncBaseTransport, unsent: dict[str, str]) -> None:
        self._inner = inner
        self._unsent = unsent

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        try:
            return await self._inner.handle_async_request(request)
        except (httpx2.ConnectError, httpx2.ConnectTimeout) as exc:
            key = _call_key(request.content)
            if key is not None:
                if len(self._unsent) >= 64:  # a call cancelled meanwhile never took its own
                    del self._unsent[next(iter(self._unsent))]
                self._unsent[key] = _describe(exc)
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()


def _call_key(body: bytes) -> str | None:
    """The idempotency key of the ``tools/call`` request `body` holds (None: another request)."""
    try:
        message = json.loads(body)
        key = message["params"]["_meta"][IDEMPOTENCY_META_KEY]
    except (ValueError, KeyError, TypeError):
        return None
    return key if isinstance(key, str) and message.get("method") == "tools/call" else None


def _meta(key: str) -> types.RequestParamsMeta:
    # an open map (extra keys round-trip); the typed dict names only the reserved keys
    meta: Any = {IDEMPOTENCY_META_KEY: key}
    return cast(types.RequestParamsMeta, meta)


async def _first(*waits: Awaitable[Any]) -> None:
    tasks = [asyncio.ensure_future(wait) for wait in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


async def _cancel(work: asyncio.Future[Any]) -> None:
    """Cancel a call and wait for it to go (the SDK sends ``notifications/cancelled``)."""
    work.cancel()
    with contextlib.suppress(BaseException):
        await asyncio.wait_for(asyncio.shield(asyncio.wait([work])), 10.0)


def _spawn_failed(exc: BaseException) -> bool:
    """Whether the failure is a program that cannot be started at all (it will not get better)."""
    found = [exc]
    while found:
        item = found.pop()
        if isinstance(item, FileNotFoundError | PermissionError | NotADirectoryError):
            return True
        if isinstance(item, BaseExceptionGroup):
            found.extend(item.exceptions)
        elif item.__cause__ is not None:
            found.append(item.__cause__)
    return False


_OUTPUT_CHECK = re.compile(
    r"Tool .* has an output schema but did not return structured content"
    r"|Invalid structured content returned by tool |Invalid schema for tool "
)
"""What the MCP SDK raises when a result fails the tool's declared output schema."""
_SDK_CLOSED = "Connection closed"
"""What the MCP SDK says when the connection itself ended (every call on it is cut)."""


def _from_here(path: str, cwd: str | None = None) -> str:
    """Where a relative `path` was looked for: `` (read from /srv)`` (nothing when absolute).

    A configuration file's paths are not read from its own directory: the message says where.
    """
    if os.path.isabs(path):
        return ""
    return f" (read from {os.path.abspath(cwd) if cwd is not None else os.getcwd()})"


_CLOSED_WORDS = "the connection closed (the server exited or closed its output)"


def _describe(exc: BaseException) -> str:
    """One line about a failure (the innermost of a group), for health and the model."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, _Refused | _Lost):  # ours, already in words ("_Lost: _Lost: ..." grew)
        return str(exc)
    if isinstance(exc, MCPError) and exc.code == CONNECTION_CLOSED and str(exc) == _SDK_CLOSED:
        return _CLOSED_WORDS
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _first_fault(exc: ValidationError, listed: Any = None) -> str:
    """Where an answer first breaks the protocol: ``tool 'x' (tools.1): inputSchema: ...``.

    `listed`: the tool list as it came, where the tool's name is found when the fault lies
    deeper in it than its own fields.
    """
    first = exc.errors()[0]
    loc = [str(part) for part in first["loc"]]
    said = f"{first['msg']}"
    if len(loc) >= 2 and loc[0] == "tools":
        tool = first.get("input") if len(loc) == 3 else None
        if tool is None and isinstance(listed, list) and loc[1].isdigit():
            tool = listed[int(loc[1])] if int(loc[1]) < len(listed) else None
        name = tool.get("name") if isinstance(tool, dict) else None
        who = f"tool {name[:100]!r}" if isinstance(name, str) else "a tool"
        rest = ".".join(loc[2:])
        return f"{who} (tools.{loc[1]}): {rest + ': ' if rest else ''}{said}"
    return f"{'.'.join(loc) or 'the answer'}: {said}"
