"""Agent profiles on lanes: a thread's profile, written to its lane when a run starts.

A thread's profile is its route's (`Settings.profile_for`). Before a message starts a run, the
worker makes the lane's configuration the profile's (`LaneProfiles.apply`): the runtime's
per-lane entries (a model change; the active tools, the harness's tools the profile allows) and
one ``gateway.profile`` custom entry naming the profile, its digest, the tools and where the
lane is. Nothing is written when the lane already has exactly that, and nothing while a run is
open: a run keeps the configuration it started with (the operation holds it), so a change of
profile takes effect on the lane's next run, and the entry shows it in the lane's timeline.

The system prompt is the profile's instructions and a "where you are" block (channel, space,
thread, who started the thread): the same for every request of the lane, so a provider's prompt
cache holds, and never growing with the conversation. It is fixed when a run starts (the
``before_run`` hook reads the lane's profile entry) and stored with the run, so a run resumed
by another process after a crash has the prompt it started with. Who wrote a message goes on
the message itself as ``[name (id)]``, only when it is not the person who started the thread
(`author_tag`).

What a run is *offered* stays what it began with; what *runs* is judged by the profile of now
(`within_profile`, D406): a tool the thread's profile no longer allows (a restart with a
narrower profile) is not run, whether the model calls it again or an approval comes for it.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from pydantic import Field

from adapters import Author, ThreadRef
from config import Profile, Settings
from config.profiles import allowed_tools
from gateway.logs import event
from harness_core import AgentHarness, AgentLane, BeforeRunResult, BranchQuery, ModelRef
from harness_core.frozen import Frozen
from harness_core.tools import Tool, ToolContext, ToolOutput

__all__ = [
    "PROFILE_ENTRY",
    "LaneProfile",
    "LaneProfiles",
    "author_tag",
    "lane_profile",
    "model_ref",
    "system_prompt",
    "within_profile",
]

log = logging.getLogger(__name__)

PROFILE_ENTRY = "gateway.profile"
"""The custom type of the entry that says which profile a lane has from there on."""
_NAME_CHARS = 64
_ID_CHARS = 128
_WHERE_CHARS = 256
_UNSAFE = re.compile(r"[\[\]\x00-\x1f\x7f]+")


class LaneProfile(Frozen):
    """What a lane was given: the ``gateway.profile`` entry's data."""

    profile: str
    digest: str
    """`Profile.digest` of the profile as it was applied."""
    model: str
    """``provider:model_id`` of the lane's model from here on."""
    tools: tuple[str, ...]
    """The tools the lane's model may call from here on."""
    channel: str
    space: str
    thread: str
    started_by: str | None = None
    """Who started the thread, as `author_tag` names people (``Alice (U123)``)."""
    started_by_id: str | None = Field(default=None, max_length=_ID_CHARS)


def model_ref(text: str) -> ModelRef:
    """``provider:model_id`` as a `ModelRef`."""
    provider, _, model_id = text.partition(":")
    return ModelRef(provider=provider, model_id=model_id)


def _clean(text: str, limit: int) -> str:
    """`text` on one line without brackets, cut to `limit` characters (bounded, unambiguous)."""
    flat = " ".join(_UNSAFE.sub(" ", text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _person(author: Author) -> str:
    who = _clean(author.id, _ID_CHARS) or "?"
    name = _clean(author.name, _NAME_CHARS) if author.name else ""
    return f"{name} ({who})" if name and name != who else who


def author_tag(author: Author) -> str:
    """The prefix of a message from someone other than the thread's starter: ``[Alice (U123)]``.

    At most ~200 characters whatever the channel sends: the name is cut to 64, the id to 128,
    and brackets and line breaks are taken out, so a name cannot pose as another tag.
    """
    return f"[{_person(author)}]"


def system_prompt(instructions: str | None, where: LaneProfile) -> str:
    """A lane's system prompt: the instructions, then where the agent is (stable per lane)."""
    lines = [
        "## Where you are",
        f"Channel: {_clean(where.channel, _WHERE_CHARS)}",
        f"Space: {_clean(where.space, _WHERE_CHARS)}",
        f"Thread: {_clean(where.thread, _WHERE_CHARS)}",
    ]
    if where.started_by:
        lines += [
            f"Started by: {where.started_by}",
            f"Messages from anyone else begin with their name and id in brackets, like "
            f"{author_tag(Author(id='U123', name='Alice'))}.",
        ]
    block = "\n".join(lines)
    return f"{instructions.strip()}\n\n{block}" if instructions and instructions.strip() else block


_NEWEST = BranchQuery(start="", custom_type=PROFILE_ENTRY, limit=1)
"""A lane's newest profile entry on its path (the lane's leaf fills `start`)."""


async def lane_profile(lane: AgentLane) -> LaneProfile | None:
    """The profile the lane's path holds (its newest ``gateway.profile`` entry), or None."""
    found = await lane.session.find_entries_on_branch(_NEWEST)
    if not found:
        return None
    data = getattr(found[0].entry, "data", None)
    try:
        return LaneProfile.model_validate(data)
    except ValueError:  # an entry of another shape: as if the lane had none
        return None


_SPACES_KEPT = 4096
"""Spaces whose profile `LaneProfiles` keeps made (past it, it starts again)."""


class LaneProfiles:
    """The deployment's profiles as the worker applies them to lanes.

    Args:
        settings: the profiles and routes.
        model: the service's model (``GATEWAY_MODEL`` or the plugin's), for profiles that set
            none.
    """

    def __init__(self, settings: Settings, model: ModelRef) -> None:
        self.settings = settings
        self.model = model
        # every message asks for its thread's profile, and the settings are frozen: each is
        # made once (a space's, bounded; a name's; the default)
        self._of_space: dict[tuple[str, str], Profile] = {}
        self._named: dict[str, Profile | None] = {}
        self._default = settings.default_profile

    def of(self, thread: ThreadRef) -> Profile:
        """The profile of `thread` (its route's, else the default)."""
        key = (thread.channel, thread.space)
        found = self._of_space.get(key)
        if found is None:
            if len(self._of_space) >= _SPACES_KEPT:
                self._of_space.clear()
            found = self._of_space[key] = self.settings.profile_for(*key)
        return found

    def named(self, name: str) -> Profile | None:
        """The profile called `name` (unset fields filled from the top level), or None."""
        if name not in self._named:
            self._named[name] = self.settings.profile_named(name)
        return self._named[name]

    def approvers(self, thread: ThreadRef) -> frozenset[str] | None:
        """Who may decide the approval requests of `thread` (None: the channel's rule)."""
        approvers = self.of(thread).approvers
        return None if approvers is None else frozenset(approvers)

    def wanted(
        self,
        thread: ThreadRef,
        author: Author,
        tools: Sequence[str],
        current: LaneProfile | None,
    ) -> LaneProfile:
        """What the lane of `thread` should have for a run `author`'s message starts.

        The thread's starter is the one the lane recorded first (else `author`): it stays in
        the system prompt for the lane's whole life.
        """
        profile = self.of(thread)
        model = profile.model or f"{self.model.provider}:{self.model.model_id}"
        known = current is not None and current.started_by_id is not None
        return LaneProfile(
            profile=profile.name,
            digest=profile.digest(),
            model=model,
            tools=allowed_tools(profile, tools),
            channel=thread.channel,
            space=thread.space,
            thread=thread.thread,
            started_by=current.started_by if known and current else _person(author),
            started_by_id=current.started_by_id
            if known and current
            else _clean(author.id, _ID_CHARS),
        )

    async def apply(
        self, lane: AgentLane, thread: ThreadRef, author: Author, tools: Sequence[str]
    ) -> LaneProfile:
        """Give the idle `lane` its thread's profile (nothing is written when it has it).

        Call only while the lane has no open operation: written during a run, the entries
        would be taken at its next checkpoint, mid-run.
        """
        current = await lane_profile(lane)
        wanted = self.wanted(thread, author, tools, current)
        if current == wanted:
            return wanted
        model = model_ref(wanted.model)
        if await lane.get_model() != model:
            await lane.set_model(model)
        if tuple(await lane.get_active_tools()) != wanted.tools:
            await lane.set_active_tools(wanted.tools)
        await lane.session.append_custom_entry(PROFILE_ENTRY, wanted.model_dump(mode="json"))
        return wanted

    def tag(self, given: LaneProfile, author: Author) -> str | None:
        """`author_tag` of `author`, unless they started the thread (the prompt names them)."""
        if given.started_by_id is not None and given.started_by_id == _clean(author.id, _ID_CHARS):
            return None
        return author_tag(author)

    def prompt(self, given: LaneProfile | None) -> str | None:
        """The system prompt of a lane whose path holds `given` (None: the default's own)."""
        if given is None:
            return None
        profile = self.named(given.profile) or self._default
        return system_prompt(profile.instructions, given)

    async def run_prompt(
        self, harness: AgentHarness, lane_name: str, given: LaneProfile | None = None
    ) -> BeforeRunResult | None:
        """The ``before_run`` answer for a run of `lane_name`: its profile's system prompt.

        `given`: the profile the run was just given (else the lane's newest profile entry is
        read).
        """
        if given is None:
            lane = await harness.lane(lane_name)
            given = await lane_profile(lane) if lane is not None else None
        prompt = self.prompt(given)
        return None if prompt is None else BeforeRunResult(system_prompt=prompt)

    def attempts(self, thread: ThreadRef | None) -> int:
        """The attempt cap of `thread`'s lane (the default profile's when unknown)."""
        profile = self.of(thread) if thread is not None else self._default
        return profile.max_attempts or self.settings.max_attempts

    def turns(self, thread: ThreadRef | None) -> int:
        """The turn limit of `thread`'s lane (the default profile's when unknown)."""
        profile = self.of(thread) if thread is not None else self._default
        return profile.max_turns or self.settings.max_turns

    def budget(self, thread: ThreadRef | None) -> int | None:
        """The token budget of `thread`'s lane (the default profile's when unknown; None: none)."""
        profile = self.of(thread) if thread is not None else self._default
        return profile.token_budget or self.settings.token_budget

    def default_prompt(self) -> str | None:
        """The system prompt of a lane that holds no profile entry: the default instructions."""
        return self._default.instructions


def within_profile(
    tool: Tool,
    profiles: LaneProfiles,
    thread_of: Callable[[str], Awaitable[ThreadRef | None]],
) -> Tool:
    """`tool`, run only while its lane's thread's profile allows it (D406).

    A run keeps the tools it was offered when it began, so its prompt holds; but a profile
    narrowed meanwhile (and the gateway restarted) is a rule about what may *happen*: a call
    it denies, approved or not, is not run, and the model reads why. A lane whose thread is
    unknown runs it (no profile can be judged).
    """
    name = tool.name
    run = tool.execute

    async def execute(args: Any, ctx: ToolContext) -> ToolOutput | str:
        thread = await thread_of(ctx.lane)
        profile = profiles.of(thread) if thread is not None else None
        if profile is None or profile.allows(name):
            return await run(args, ctx)
        log.warning(
            event(
                "tool not allowed by its profile",
                session=ctx.session_id,
                lane=ctx.lane,
                tool=name,
                profile=profile.name,
            )
        )
        said = (
            f"the tool {name!r} is no longer allowed in this thread (its profile changed): "
            "it was not run; do not call it again"
        )
        return ToolOutput.text(said, is_error=True)

    return dataclasses.replace(tool, execute=execute)
