"""What the operator API returns: response models (they are its OpenAPI schema)."""

from __future__ import annotations

import base64
import binascii
import unicodedata
from typing import Annotated, Any, Generic, Literal, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, Strict, field_validator, model_validator

from gateway.budgets import MAX_BUDGET
from gateway.ops.errors import ApiError
from harness_core.session.records import MAX_SUPPLIED_CHARS

__all__ = [
    "ActionRequest",
    "AuditView",
    "AuthorityRequest",
    "AuthorityView",
    "BacklogView",
    "CallDecision",
    "DecidedView",
    "DecisionsRequest",
    "DeliveryView",
    "InterruptedCallView",
    "LaneView",
    "McpServerView",
    "McpView",
    "Page",
    "PendingCallView",
    "RerunRequest",
    "RevokedView",
    "SessionView",
    "TimelineItem",
    "TimelinePage",
    "UsageItem",
    "WhoAmIView",
    "decode_cursor",
    "encode_cursor",
    "lane_id",
    "lane_of",
    "spelled_if_mixed",
]

_T = TypeVar("_T")


class _View(BaseModel):
    model_config = ConfigDict(frozen=True)


class Page(_View, Generic[_T]):
    """A page of a collection; pass `next_cursor` as `cursor` for the next one (null: the end)."""

    items: list[_T]
    next_cursor: str | None = None


class RevokedView(_View):
    """Why a lane (or a session) may no longer act or speak, since when, and who said so."""

    scope: Literal["lane", "session", "space", "channel"]
    """What the revocation covers: the lane, its session, its thread's space, its channel."""
    scope_name: str
    cause: str
    """``operator``, ``route_removed``, or the channel's event (``member_left_channel``...)."""
    why: str
    by: str
    at_ms: int


class SessionView(_View):
    """A session of the store."""

    id: str
    name: str | None = None
    created_at_ms: int
    lanes: int
    held_by: str | None = None
    """The worker executing it now (its store lease), if any."""
    revoked: RevokedView | None = None
    """Set when an operator revoked the whole session (D267)."""


class PendingCallView(_View):
    """A tool call waiting for a decision."""

    tool_call_id: str
    tool_name: str
    arguments: dict[str, Any]
    args_digest: str


class DecidedView(_View):
    """A lane's latest approval decision: which wait, who decided, when, and what."""

    wait_id: str
    decided_by: str | None = None
    at_ms: int
    calls: dict[str, Literal["approved", "denied", "supplied"]]
    """Each decided call by its id."""


class InterruptedCallView(_View):
    """A tool call that started and has no result."""

    tool_call_id: str
    tool_name: str
    replay: str
    """The declaration it started under: ``safe`` or ``never``."""
    on_resume: dict[str, str]
    """What a resume does to it, by `tool_recovery` (declared, never, always)."""


class LaneView(_View):
    """A lane, its status and what an operator may do with it."""

    id: str
    """Opaque: the session and lane, for the lane's routes."""
    session: str
    lane: str
    lane_spelled: str | None = None
    """The lane with every character outside ASCII spelled ``\\uXXXX``, when its thread's
    letters come from more than one script (`spelled_if_mixed`): a thread ``pay`` with a
    Cyrillic ``a`` and the Latin one look alike on a page; None otherwise."""
    status: str
    """idle, running, suspended, aborting, failed, stuck or faulted."""
    leaf_id: str | None = None
    suspended: str | None = None
    """Why an open operation waits: crash, deferred or approval."""
    attempts: int = 0
    max_attempts: int
    """The lane's attempt cap: its thread's profile's, else the top-level one."""
    token_budget: int | None = None
    """Tokens the lane may spend in all (its profile's, else the top level's; None: none)."""
    operation_id: str | None = None
    operation_kind: str | None = None
    activity: str | None = None
    last_outcome: str | None = None
    error: dict[str, Any] | None = None
    fault: str | None = None
    wait_id: str | None = None
    pending_approvals: list[PendingCallView] = Field(default_factory=list)
    interrupted_calls: list[InterruptedCallView] = Field(default_factory=list)
    """The calls a resume would find cut, and what each policy does to them (listed while a
    resume is one of `actions`)."""
    queued: int = 0
    last_decision: DecidedView | None = None
    """Its latest approval decision, so a decision that came too late can say whose came
    first (None: none was ever made)."""
    thread: dict[str, Any] | None = None
    """The channel thread the lane answers (channel, space, thread)."""
    held_by: str | None = None
    revoked: RevokedView | None = None
    """Set when the lane's authority is revoked (D267): its open run ends
    ``authority_revoked``, its messages are kept and not run, nothing is posted in its thread."""
    actions: list[str] = Field(default_factory=list)
    """The actions its status allows now."""


class TimelineItem(_View):
    """An item of a lane's log: an entry, a record or a move."""

    seq: int
    at_ms: int
    kind: Literal["entry", "record", "move"]
    type: str
    id: str | None = None
    run_id: str | None = None
    summary: str
    """One line a person reads."""
    data: dict[str, Any]
    """The stored item as JSON (content included; the store holds no keys or secrets)."""


class UsageItem(_View):
    """One measurement of the cost ledger."""

    seq: int
    at_ms: int
    cause: str
    run_id: str | None = None
    entry_id: str | None = None
    attempt: int | None = None
    stop_reason: str | None = None
    usage: dict[str, Any]


class BacklogView(_View):
    """What waits in the inbox and the outbox."""

    inbox_pending: int
    inbox_oldest_age_ms: int
    inbox_rejected: int
    outbox_pending: int
    outbox_oldest_age_ms: int
    dead_letters: int


class DeliveryView(_View):
    """An outbound message and its delivery state."""

    id: str
    session: str
    lane: str
    status: str
    attempts: int
    last_error: str | None = None
    """The last failed attempt's error; kept once a later attempt delivered it (the history)."""
    unknown_outcome: bool = False
    kind: str | None = None
    text: str | None = None
    created_at_ms: int
    settled_at_ms: int | None = None


class AuditView(_View):
    """An event of the audit trail."""

    id: str
    at_ms: int
    actor: str
    action: str
    session: str | None = None
    lane: str | None = None
    target: str | None = None
    outcome: str
    details: dict[str, Any]


class McpServerView(_View):
    """One configured MCP server: what it runs or reaches, its state, tools and faults."""

    name: str
    transport: Literal["stdio", "http"]
    target: str
    """The command's program name, or the URL without credentials."""
    state: Literal["starting", "ready", "restarting", "failed", "stopped"]
    trusted: bool
    """Whether its tool annotations are taken as declared (else they may only add care)."""
    tools: list[str]
    """The namespaced tools it offers now (``<server>.<tool>``)."""
    restarts: int
    calls: int
    failures: int
    """Calls that ended in a transport fault, a timeout or a malformed result."""
    last_error: str | None = None
    stderr: str | None = None
    """The last lines a stdio server wrote to stderr before it last went down (redacted)."""
    since_ms: int | None = None
    """When it entered `state`."""
    retry_at_ms: int | None = None
    """When restarting: when the next attempt starts."""


class McpView(_View):
    """The MCP servers this gateway is configured with (none: an empty list)."""

    servers: list[McpServerView]


class TimelinePage(Page[TimelineItem]):
    """A page of a lane's log, and (on the first page) what workers and operators did to it."""

    audit: list[AuditView] = Field(default_factory=list)
    """The lane's audit events in record order (the first 200): takeovers, stuck, actions."""


class _Request(BaseModel):
    """A request body: no unknown field, and no text a store or a log should not hold."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="after")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        # NUL and unpaired surrogates were taken into the audit trail (an outside probe's
        # rewind of "\u0000"); the channels refuse them with 400 too
        for text in _texts(value):
            if "\x00" in text:
                raise ValueError("must not contain NUL characters")
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError("is not valid Unicode text") from None
        return value


def _texts(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):  # a nested request (a call's decision) checks its own fields
        return [t for key, item in value.items() for t in (*_texts(key), *_texts(item))]
    return []


class ActionRequest(_Request):
    """resume / unstick: what becomes of tool calls that started and have no result."""

    tool_recovery: Literal["declared", "never", "always"] = "declared"


class BudgetRequest(_Request):
    """budget: the lane's token budget from now on (null: its profile's again), and why."""

    tokens: Annotated[int, Strict(), Field(ge=1, le=MAX_BUDGET)] | None
    """Tokens the lane may spend in all, what it spent included; null: its profile's budget."""
    reason: str | None = Field(default=None, min_length=1, max_length=300)


class WhoAmIView(_View):
    """Who the caller's token is: its name (the audit trail's actor) and what it may do."""

    name: str
    role: Literal["viewer", "operator"]
    """``viewer`` reads; ``operator`` reads and acts."""


class BudgetView(_View):
    """A lane's token budget after a budget call, and what its ledger holds against it."""

    id: str
    changed: bool
    """False: it held already."""
    budget: int | None
    """The budget in force: the operator's, else its profile's (None: the thread has none)."""
    profile_budget: int | None
    """Its thread's profile's budget (what a reset gives it back)."""
    spent: int
    """Its ledger's total tokens."""
    set_by: str | None = None
    set_at_ms: int | None = None
    reason: str | None = None


class AuthorityRequest(_Request):
    """revoke / unrevoke: why (recorded, and shown to operators)."""

    reason: str | None = Field(default=None, min_length=1, max_length=300)


class AuthorityView(_View):
    """A revocation after a revoke or an unrevoke, and whether the call changed it."""

    changed: bool
    """False: it held already (revoked before, or nothing to restore)."""
    revoked: RevokedView | None = None
    """The scope's revocation now (None: its authority is back)."""
    restored_by: str | None = None
    restored_at_ms: int | None = None


class RerunRequest(_Request):
    """rewind: the user message to run again (the lane moves to just before it)."""

    entry_id: str = Field(min_length=1, max_length=256)


class CallDecision(_Request):
    """Approve or deny one call, or give its result: the operator did the action themselves."""

    action: Literal["approve", "deny", "supply"]
    reason: str | None = Field(default=None, max_length=4096)
    """Why it was denied (the model reads it), or a note recorded with the decision."""
    result: str | None = Field(default=None, max_length=MAX_SUPPLIED_CHARS)
    """``supply``: the call's result, what the model reads (the tool does not run)."""
    is_error: bool = False
    """``supply``: the action failed (the model reads a failed call)."""

    @model_validator(mode="after")
    def _result_only_when_supplied(self) -> Self:
        if self.action == "supply" and (self.result is None or not self.result.strip()):
            raise ValueError("supply needs the call's result: a non-empty 'result'")
        if self.action != "supply" and (self.result is not None or self.is_error):
            raise ValueError(f"'result' and 'is_error' go with supply, not {self.action}")
        return self


class DecisionsRequest(_Request):
    """Decisions for exactly the pending calls of the wait `wait_id` names."""

    wait_id: str = Field(min_length=1, max_length=256)
    approvals: dict[str, CallDecision] = Field(min_length=1, max_length=128)


def lane_id(session: str, lane: str) -> str:
    """The opaque, URL-safe id of a session's lane."""
    raw = f"{session}\n{lane}".encode()
    return "ln_" + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def lane_of(value: str) -> tuple[str, str]:
    """(session, lane) of a lane id; `ApiError` 404 for one that is not ours."""
    if value.startswith("ln_"):
        body = value[3:]
        try:
            text = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()
        except (binascii.Error, UnicodeDecodeError, ValueError):
            text = ""
        session, sep, lane = text.partition("\n")
        if sep and session and lane:
            return session, lane
        raise ApiError(404, "not_found", f"no lane {value[:80]!r}")
    # a name where the id goes (`/lanes/web:ship`): say what the API takes
    raise ApiError(
        404,
        "not_found",
        f"no lane {value[:80]!r}: the API names a lane by its id (ln_..., the `id` that GET "
        "/api/v1/lanes lists); `gateway ops` takes the lane's name",
    )


def encode_cursor(*parts: str) -> str:
    """An opaque cursor of `parts` (see `decode_cursor`)."""
    raw = "\n".join(parts).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(value: str | None, count: int) -> tuple[str, ...] | None:
    """A cursor's parts; `ApiError` 400 ``invalid_cursor`` for one we did not make."""
    if value is None or value == "":
        return None
    try:
        text = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        text = ""
    parts = tuple(text.split("\n"))
    if len(parts) != count or not all(parts):
        raise ApiError(400, "invalid_cursor", "the cursor is not one this API returned")
    return parts


def spelled_if_mixed(lane: str) -> str | None:
    r"""`lane` with its non-ASCII characters spelled ``\uXXXX`` when look-alike, else None.

    Look-alike: the letters of its thread (after the channel's ``web:``) come from more than
    one script (Latin and Cyrillic, say); Japanese's three count as one.
    """
    thread = lane.partition(":")[2] or lane
    scripts = {
        _ONE_SCRIPT.get(word, word)
        for word in (unicodedata.name(c, "?").split(" ")[0] for c in thread if c.isalpha())
    }
    if len(scripts) < 2:
        return None
    return "".join(char if char.isascii() else f"\\u{ord(char):04x}" for char in lane)


_ONE_SCRIPT = {"HIRAGANA": "CJK", "KATAKANA": "CJK"}
