"""The web channel's mailbox: every thread's messages and replies, in order, durably.

A thread (a space and a thread id) holds items numbered 1, 2, 3... by the mailbox: the
messages people posted, the replies the gateway delivered (plain replies, approval requests,
failure notices) and the decisions people sent. Each item has an identity (the client's
message id, the delivery id, the decision's idempotency key): appending an identity the thread
already holds changes nothing and returns the item it holds, so delivering the same reply twice
stores it once, and `find` answers whether a delivery arrived (`reconcile`).

`wait` returns the items after a sequence number as soon as there are any: what the Server-Sent
Events stream and a reconnecting client (``Last-Event-ID``) read.

Backends (`open_mailbox(url)`):

* ``memory://`` - this process only (tests).
* ``sqlite:///.gateway/web.db`` (three slashes: relative; four: absolute) - one file, one
  process (the embedded default); a second process on the same file sees new items within a
  second (polling), not at once.
* ``redis://host:6379/0`` (``rediss://`` for TLS) ``[?prefix=gww]`` - any number of processes:
  a client connected to one sees what another delivered at once (`XREAD BLOCK`);
  ``redis+cluster://host:port`` (``rediss+cluster://``) for a Redis Cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import unicodedata
from collections.abc import Iterator
from typing import Literal, Protocol, runtime_checkable

from pydantic import Field

from adapters.channel import ApprovalClosed, ApprovalView, Attachment, Author, DecisionItem
from adapters.errors import AdapterError
from harness_core.backends.urls import (
    MemoryUrl,
    MemoryUrls,
    Openers,
    PathUrl,
    RedisUrl,
    RedisUrls,
    SqliteUrls,
    shown,
)
from harness_core.frozen import Frozen

__all__ = [
    "DEFAULT_MAILBOX_URL",
    "MailboxError",
    "MailboxUnavailable",
    "MemoryMailbox",
    "NewWebItem",
    "WebAppend",
    "WebDecision",
    "WebItem",
    "WebItemKind",
    "WebMailbox",
    "WebThread",
    "check_mailbox_url",
    "check_name",
    "normal_name",
    "open_mailbox",
]

DEFAULT_MAILBOX_URL = "sqlite:///.gateway/web.db"
ACCEPTED_URLS = (
    "accepted web mailbox URLs: memory://; sqlite:///relative.db or sqlite:////absolute.db; "
    "redis://host:port/db or rediss://host:port/db [?prefix=name]; "
    "redis+cluster://host:port or rediss+cluster://host:port [?prefix=name]"
)
NAME_RULE = (
    "1-200 letters (of any script), digits, '.', '_' and '-', not only dots, in Unicode's "
    "composed form (NFC)"
)
"""A thread id or a space, in words (D165): ``.`` and ``..`` would be path segments in the
page's links; combining marks (``é`` typed as ``e`` + accent) count after a letter or digit."""
_NAME_PUNCTUATION = frozenset("._-")

WebItemKind = Literal[
    "message", "reply", "approval_request", "failure_notice", "decision", "approval_closed"
]
_FAMILY = {
    "message": "m",
    "reply": "d",
    "approval_request": "d",
    "failure_notice": "d",
    "approval_closed": "d",
    "decision": "x",
}
"""Identities are unique per family: a message id, a delivery id (whatever its kind), a click."""


def check_name(value: str, what: str) -> str:
    """`value` if it is a valid thread id or space (`NAME_RULE`), else ValueError naming the rule.

    A name not in NFC is refused, not changed: the web channel normalizes what a person
    typed before it asks (`normal_name`), so every backend keys a thread by one spelling.
    """
    if not _valid_name(value):
        raise ValueError(f"{what} must be {NAME_RULE}")
    return value


def normal_name(value: str, what: str) -> str:
    """`value` in NFC, checked (`check_name`): ``é`` typed either way is one thread."""
    return check_name(unicodedata.normalize("NFC", value), what)


def _valid_name(value: str) -> bool:
    if not 1 <= len(value) <= 200 or not value.strip("."):
        return False
    if not unicodedata.is_normalized("NFC", value):
        return False
    previous = ""
    for char in value:
        kind = unicodedata.category(char)
        if kind[0] == "M":  # a combining mark belongs to the letter or digit before it
            if not previous or previous in _NAME_PUNCTUATION:
                return False
        elif not (kind[0] == "L" or kind == "Nd" or char in _NAME_PUNCTUATION):
            return False
        previous = char
    return True


class MailboxError(AdapterError):
    """The mailbox could not do what was asked (a malformed URL, a corrupt item)."""


class MailboxUnavailable(MailboxError):
    """The backend did not answer (I/O error, connection lost, timeout).

    `unknown_outcome` is set when a write may have happened anyway (its reply was lost).
    """

    def __init__(self, reason: str, *, unknown_outcome: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.unknown_outcome = unknown_outcome


class WebDecision(Frozen):
    """A decision a person sent from the page (what the thread shows under the request)."""

    run_id: str
    wait_id: str
    decisions: tuple[DecisionItem, ...] = Field(min_length=1)


class NewWebItem(Frozen):
    """An item to append to a thread."""

    kind: WebItemKind
    id: str = Field(min_length=1, max_length=1024)
    """The message id, the delivery id or the decision's idempotency key."""
    text: str = ""
    """Markdown as written (never interpreted as HTML)."""
    author: Author | None = None
    approval: ApprovalView | None = None
    """For ``approval_request``: the calls and the wait the buttons answer."""
    decision: WebDecision | None = None
    """For ``decision``."""
    closed: ApprovalClosed | None = None
    """For ``approval_closed``: the request that no longer waits (the page closes its cards)."""
    files: tuple[Attachment, ...] = ()
    """For ``reply``: the files it sends (blobs the page links to, ``files/{blob}``); for
    ``message``: the files its sender attached, by name, type, size and ``ref``, the digest of
    their bytes (``sha256:<hex>``; no blob: the agent got their content, the thread keeps none
    of it)."""
    at_ms: int
    """When it was appended (the first time), on the channel's clock."""

    @property
    def key(self) -> str:
        """The identity the thread deduplicates on (``m:<id>``, ``d:<id>`` or ``x:<id>``)."""
        return item_key(self.kind, self.id)


class WebItem(NewWebItem):
    """An item of a thread."""

    seq: int = Field(ge=1)
    """Its place in the thread (1, 2, 3...): the Server-Sent Events id."""


def item_key(kind: WebItemKind, identity: str) -> str:
    """The dedupe key of an item of `kind` with `identity`."""
    return f"{_FAMILY[kind]}:{identity}"


class WebAppend(Frozen):
    """What `append` did: the thread's item for that identity, and whether it is new."""

    item: WebItem
    created: bool


class WebThread(Frozen):
    """A thread of a space, for listings."""

    space: str
    thread: str
    updated_at_ms: int


@runtime_checkable
class WebMailbox(Protocol):
    """The durable threads of the web channel (every method may raise `MailboxUnavailable`)."""

    async def append(self, space: str, thread: str, item: NewWebItem) -> WebAppend:
        """Append `item` unless the thread holds its identity; durable on return."""
        ...

    async def find(
        self, space: str, thread: str, kind: WebItemKind, identity: str
    ) -> WebItem | None:
        """The thread's item of that family and identity, if any."""
        ...

    async def read(
        self, space: str, thread: str, *, after: int = 0, limit: int = 100
    ) -> tuple[WebItem, ...]:
        """The thread's items with ``seq > after``, oldest first, up to `limit`."""
        ...

    async def wait(
        self, space: str, thread: str, *, after: int, timeout_s: float, limit: int = 100
    ) -> tuple[WebItem, ...]:
        """Like `read`, but if there is nothing yet, wait up to `timeout_s` for something."""
        ...

    async def threads(self, space: str, *, limit: int = 100) -> tuple[WebThread, ...]:
        """The space's threads, most recently updated first (ties: thread id descending)."""
        ...

    async def close(self) -> None:
        """Release connections and files (idempotent); waiters return."""
        ...


class Signals:
    """In-process wake-ups per thread: appenders `notify`, waiters `listen`."""

    def __init__(self) -> None:
        self._listeners: dict[tuple[str, str], set[asyncio.Event]] = {}
        self.closed = False

    def notify(self, space: str, thread: str) -> None:
        """Wake every waiter of the thread."""
        for event in self._listeners.get((space, thread), ()):
            event.set()

    def close(self) -> None:
        """Wake every waiter (the mailbox is closing)."""
        self.closed = True
        for events in self._listeners.values():
            for event in events:
                event.set()

    @contextlib.contextmanager
    def listen(self, space: str, thread: str) -> Iterator[asyncio.Event]:
        """An event set when the thread changes (register before reading: nothing is missed)."""
        event = asyncio.Event()
        listeners = self._listeners.setdefault((space, thread), set())
        listeners.add(event)
        try:
            yield event
        finally:
            listeners.discard(event)
            if not listeners:
                self._listeners.pop((space, thread), None)


async def wait_with_signals(
    mailbox: WebMailbox,
    signals: Signals,
    space: str,
    thread: str,
    *,
    after: int,
    timeout_s: float,
    limit: int,
    poll_s: float | None,
) -> tuple[WebItem, ...]:
    """`WebMailbox.wait` for backends that wake their own process (and poll for others)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(0.0, timeout_s)
    with signals.listen(space, thread) as event:
        while not signals.closed:
            items = await mailbox.read(space, thread, after=after, limit=limit)
            remaining = deadline - loop.time()
            if items or remaining <= 0:
                return items
            step = remaining if poll_s is None else min(remaining, poll_s)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(step):
                    await event.wait()
            event.clear()
    return ()


class MemoryMailbox:
    """Threads in this process's memory (tests; nothing survives the process)."""

    def __init__(self) -> None:
        self._items: dict[tuple[str, str], list[WebItem]] = {}
        self._keys: dict[tuple[str, str], dict[str, WebItem]] = {}
        self._updated: dict[tuple[str, str], int] = {}
        self._signals = Signals()

    async def append(self, space: str, thread: str, item: NewWebItem) -> WebAppend:
        """Append `item` unless the thread holds its identity."""
        key = (check_name(space, "space"), check_name(thread, "thread"))
        known = self._keys.setdefault(key, {})
        existing = known.get(item.key)
        if existing is not None:
            return WebAppend(item=existing, created=False)
        items = self._items.setdefault(key, [])
        stored = WebItem(**item.model_dump(), seq=len(items) + 1)
        items.append(stored)
        known[item.key] = stored
        self._updated[key] = item.at_ms
        self._signals.notify(space, thread)
        return WebAppend(item=stored, created=True)

    async def find(
        self, space: str, thread: str, kind: WebItemKind, identity: str
    ) -> WebItem | None:
        """The thread's item of that family and identity, if any."""
        return self._keys.get((space, thread), {}).get(item_key(kind, identity))

    async def read(
        self, space: str, thread: str, *, after: int = 0, limit: int = 100
    ) -> tuple[WebItem, ...]:
        """The thread's items after `after`, oldest first."""
        items = self._items.get((space, thread), [])
        return tuple(items[max(0, after) : max(0, after) + max(0, limit)])

    async def wait(
        self, space: str, thread: str, *, after: int, timeout_s: float, limit: int = 100
    ) -> tuple[WebItem, ...]:
        """The items after `after`, waiting up to `timeout_s` for one."""
        return await wait_with_signals(
            self, self._signals, space, thread, after=after, timeout_s=timeout_s, limit=limit,
            poll_s=None,
        )  # fmt: skip

    async def threads(self, space: str, *, limit: int = 100) -> tuple[WebThread, ...]:
        """The space's threads, most recently updated first."""
        found = [
            WebThread(space=s, thread=t, updated_at_ms=at)
            for (s, t), at in self._updated.items()
            if s == space
        ]
        found.sort(key=lambda t: (t.updated_at_ms, t.thread), reverse=True)
        return tuple(found[: max(0, limit)])

    async def close(self) -> None:
        """Wake waiters (the items stay: a closed memory mailbox is still readable)."""
        self._signals.close()


def _refuse(url: str, why: str | None) -> MailboxError:
    what = (
        f"web mailbox URL {shown(url)}: {why}"
        if why
        else f"unsupported web mailbox URL {shown(url)}"
    )
    return MailboxError(f"{what}; {ACCEPTED_URLS}")


def _memory(_: MemoryUrl, __: None) -> WebMailbox:
    return MemoryMailbox()


def _sqlite(url: PathUrl, _: None) -> WebMailbox:
    from adapters.web.sqlite import SqliteMailbox

    return SqliteMailbox(url.path)


def _redis(url: RedisUrl, _: None) -> WebMailbox:
    from adapters.web.redis import RedisMailbox

    return RedisMailbox(url.server, prefix=url.prefix, cluster=url.cluster)


_OPENERS: Openers[WebMailbox, None] = Openers(_refuse)
_OPENERS.add(MemoryUrls(), _memory)
_OPENERS.add(SqliteUrls(memory_ok=True), _sqlite)
_OPENERS.add(RedisUrls(default_prefix="gww"), _redis)


def check_mailbox_url(url: str) -> None:
    """Refuse a URL `open_mailbox` would refuse, building nothing (the setting, checked at start).

    Raises:
        MailboxError: as `open_mailbox`.
    """
    _OPENERS.check(url)


def open_mailbox(url: str = DEFAULT_MAILBOX_URL) -> WebMailbox:
    """The mailbox a URL names (see the module docstring); nothing is created or contacted yet.

    The URL is parsed by `harness_core.backends.urls`, as the store's and the broker's are.

    Raises:
        MailboxError: an unknown scheme, a malformed path or server, or an unknown option.
    """
    return _OPENERS.open(url, None)
