"""A lane's reads of committed state: what its next request carries, and their caches.

The context window (the lane's path from its newest compaction to the leaf), its projection
into provider messages, and the lane's effective configuration. Reads are not effects: a crash
around one changes nothing durable. The caches follow the lane's own appends (`after_entry`)
and are dropped when the leaf moves or the lane leaves memory (`drop`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING

from harness_core._runtime.context import (
    ContextWindow,
    count_images,
    estimate_tokens,
    without_images,
)
from harness_core._runtime.reduction import LaneState, configure
from harness_core.messages import AgentMessage
from harness_core.session.entries import CompactionEntry, CustomEntry, EntryType
from harness_core.session.records import LaneConfiguration
from harness_core.session.types import BranchQuery, StoredEntry
from harness_core.storage._branch import BranchNode, BranchScan

if TYPE_CHECKING:
    from harness_core._runtime.lane import HarnessRuntime

__all__ = ["LaneContext", "Withheld"]


@dataclass(frozen=True, slots=True)
class Withheld:
    """Which images of a window a provider refused: the window's first entry and a message count.

    Windows only grow at their end, so the first `count` messages of a window that starts at
    `start` are the ones the refused request carried, until a compaction starts a new window or
    the leaf moves (then it is dropped, and a refusal would be learned again).
    """

    start: str | None
    count: int


class LaneContext:
    """One lane's context window, its projection and its configuration, read and cached."""

    def __init__(self, runtime: HarnessRuntime, state: Callable[[], LaneState]) -> None:
        self._runtime = runtime
        self._state = state
        """The lane's live state (read on each call: the lane replaces it on every commit)."""
        self._context: list[StoredEntry] | None = None
        self._window: ContextWindow | None = None
        """The projection of `_context`, kept in step with it."""
        self._idle_config: tuple[str | None, LaneConfiguration] | None = None
        self._withheld: Withheld | None = None
        """The images a provider refused, sent as a note from then on (D289); in memory only."""

    # -- keeping the caches in step ------------------------------------------------------------

    def after_entry(self, stored: StoredEntry) -> None:
        """Follow one of the lane's own appends (its state already advanced past it)."""
        entry = stored.entry
        if self._context is not None:
            if isinstance(entry, CompactionEntry):
                self._context = [stored]
                self._window = ContextWindow(self._runtime.options.entry_projectors)
            else:
                self._context.append(stored)
            if self._window is not None:
                self._window.add(entry)
        if self._idle_config is not None and self._idle_config[0] == stored.parent_id:
            # the cached configuration follows the lane's own appends (no path walk)
            self._idle_config = (stored.id, configure(self._idle_config[1], entry))

    def settled_configuration(self, leaf_id: str | None, config: LaneConfiguration) -> None:
        """Remember `config` as the configuration at `leaf_id` (a finished run stays there)."""
        self._idle_config = (leaf_id, config)

    def drop(self) -> None:
        """Forget the context window and configuration read from storage (read again on use).

        Called when the leaf moves, and when the lane leaves memory (eviction, the harness's
        close): the runtime's objects refer to each other, so without this a dropped lane's
        decoded window (thousands of objects on a long lane) would wait for a full collection.
        """
        self._context = None
        self._window = None
        self._idle_config = None
        self._withheld = None

    # -- reads ---------------------------------------------------------------------------------

    async def entries(self) -> list[StoredEntry]:
        """The lane's context window: its path from the newest compaction to the leaf."""
        leaf = self._state().leaf_id
        if self._context is not None:
            tail = self._context[-1].id if self._context else None
            if tail != leaf:  # kept in step with the lane's own appends only
                self._context = self._window = None
        if self._context is None:
            if leaf is None:
                self._context = []
            else:
                window = await self._runtime.storage.find_entries_on_branch(
                    BranchQuery(start=leaf, stop_at_type="compaction")
                )
                self._context = list(reversed(window))
        return list(self._context)

    def cached_path(self, query: BranchQuery) -> tuple[StoredEntry, ...] | None:
        """`query` answered from the cached window, or None when the window cannot answer it.

        It can when the window is in step with the leaf, `query` starts at the leaf, and the
        query's walk ends inside the window: the scan stopped (a limit, a stop entry) or the
        window reaches the root. The selection is the backends' own (`BranchScan`), over the
        very entries the store returned (D274).
        """
        context = self._context
        if not context or query.start != self._state().leaf_id or context[-1].id != query.start:
            return None
        scan = BranchScan(query)
        ended = context[0].parent_id is None
        fed: dict[str, StoredEntry] = {}  # only what the scan saw: a limit stops it early
        for stored in reversed(context):
            entry = stored.entry
            custom = entry.custom_type if isinstance(entry, CustomEntry) else None
            fed[stored.id] = stored
            if not scan.feed(
                BranchNode(stored.id, stored.parent_id, stored.seq, entry.type, custom)
            ):
                ended = True
                break
        if not ended:
            return None
        return tuple(fed[node.id] for node in scan.result())

    async def entry(self, entry_id: str) -> StoredEntry | None:
        """The stored entry `entry_id`: from the cached context when it holds it, else storage.

        Entries never change once stored, so a cached copy is the stored one even when the
        cache is behind the leaf. Callers ask for a run's newest entries, so the scan looks at
        the newest few only: its cost stays flat however long the lane is.
        """
        for stored in islice(reversed(self._context or ()), 16):
            if stored.id == entry_id:
                return stored
        return await self._runtime.storage.get_entry(entry_id)

    async def _projected(self) -> ContextWindow:
        if self._context is None or self._window is None:
            entries = await self.entries()
            self._window = ContextWindow(self._runtime.options.entry_projectors)
            for stored in entries:
                self._window.add(stored.entry)
        return self._window

    async def messages(self) -> tuple[AgentMessage, ...]:
        """The provider messages of the current context window."""
        return (await self._projected()).messages()

    async def request_messages(self) -> tuple[AgentMessage, ...]:
        """The messages an assistant request carries: the window's, less the images withheld."""
        messages = await self.messages()
        withheld = self._withheld
        if withheld is None:
            return messages
        if self._start() != withheld.start:  # a compaction began another window
            self._withheld = None
            return messages
        return without_images(messages, withheld.count)

    @property
    def withheld(self) -> Withheld | None:
        """The images withheld from this lane's requests (set back when withholding failed)."""
        return self._withheld

    @withheld.setter
    def withheld(self, value: Withheld | None) -> None:
        self._withheld = value

    def withhold_images(self, messages: tuple[AgentMessage, ...]) -> bool:
        """Withhold every image of `messages` (the window, just read) from later requests (D289).

        Called when a provider refused a request as invalid: a refused image would otherwise
        be sent, and refused, with every later request of the lane. False when the window holds
        no image not withheld already (nothing would change, so nothing is worth trying).
        """
        before = self._withheld
        start = self._start()
        done = before.count if before is not None and before.start == start else 0
        if count_images(messages[done:]) == 0:
            return False
        self._withheld = Withheld(start, len(messages))
        return True

    def _start(self) -> str | None:
        return self._context[0].id if self._context else None

    async def tokens(self, system_prompt: str | None) -> int:
        """The estimated size of a request carrying the context window and `system_prompt`.

        On a lane with images withheld (D289) the notes sent in their place are counted, not
        the images (a walk of the window: only such lanes pay it).
        """
        if self._withheld is not None:
            return estimate_tokens(await self.request_messages(), system_prompt)
        return (await self._projected()).tokens(system_prompt)

    async def configuration(self) -> LaneConfiguration:
        """The lane's effective configuration: the open operation's, or the path's at the leaf."""
        state = self._state()
        op = state.operation
        if op is not None:
            return op.configuration
        leaf = state.leaf_id
        if self._idle_config is not None and self._idle_config[0] == leaf:
            return self._idle_config[1]
        # The context window (which the next request loads anyway) is the path from the newest
        # compaction; only a path with a compaction needs a walk, of its older part.
        context = await self.entries()
        config = self._runtime.default_configuration()
        if context and context[0].parent_id is not None:
            config = await self._configuration_at(context[0].parent_id, config)
        for stored in context:
            config = configure(config, stored.entry)
        self._idle_config = (leaf, config)
        return config

    async def _configuration_at(
        self, entry_id: str, config: LaneConfiguration
    ) -> LaneConfiguration:
        """`config` with the newest configuration entries of the path ending at `entry_id`."""
        storage = self._runtime.storage
        for entry_type in ("model_change", "thinking_level_change", "active_tools_change"):
            found = await storage.find_entries_on_branch(
                BranchQuery(start=entry_id, type=entry_type, limit=1)
            )
            if found:
                config = configure(config, found[0].entry)
        return config

    async def path_entries_of_type(self, entry_type: EntryType) -> list[StoredEntry]:
        """The entries of `entry_type` on the lane's whole path, oldest first.

        From the context window, plus a walk of the path's older part when a compaction
        starts the window.
        """
        context = await self.entries()
        older: tuple[StoredEntry, ...] = ()
        if context and context[0].parent_id is not None:
            older = await self._runtime.storage.find_entries_on_branch(
                BranchQuery(start=context[0].parent_id, type=entry_type)
            )
        return [*reversed(older), *(s for s in context if s.entry.type == entry_type)]
