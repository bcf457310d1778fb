"""The errors harness_core raises: defects, storage errors (and, as values, expected rejections).

Tree::

    HarnessError                      root of everything harness_core raises
    ├── SessionError(code)            a storage or session contract was not met; `code` says which
    │   ├── LeaseHeld                 another writer holds the session's writer lease
    │   ├── LeaseLost                 this writer's lease expired, was released or was taken over
    │   └── StoreCorrupted            durable data is not a valid prefix; never repaired silently
    ├── RecordLogCorruption(reason)   a lane's log is a state no single writer can produce
    ├── HarnessFault                  a write failed or an invariant broke; the harness is dead
    ├── HarnessClosed                 the harness was closed while the call was in flight
    └── HarnessNotImplemented         the public method exists but its work has not landed yet

Expected rejections of public harness operations are not exceptions: they are returned as
`Err(...)` values (see `harness_core.result`).
"""

from __future__ import annotations

from typing import Literal

__all__ = [
    "CorruptionReason",
    "HarnessClosed",
    "HarnessError",
    "HarnessFault",
    "HarnessNotImplemented",
    "LeaseHeld",
    "LeaseLost",
    "RecordLogCorruption",
    "SessionError",
    "SessionErrorCode",
    "StoreCorrupted",
]

SessionErrorCode = Literal[
    "not_found",  # a session, entry, record or lane target does not exist
    "already_exists",  # a session id, entry id, record id or lane name is taken
    "unknown_lane",  # the lane named by a write or read does not exist
    "invalid_lane",  # a lane name breaks the naming rules
    "invalid_session_id",  # a session id breaks the naming rules
    "invalid_query",  # a query or read argument is malformed or out of range
    "invalid_payload",  # a payload is not JSON-serializable or not a known type
    "content_mismatch",  # append-if-missing found the id with different content (corruption)
    "lane_busy",  # operation_started on a lane whose open operation is not null
    "read_only",  # a write on a storage opened without a writer lease
    "lease_held",  # see LeaseHeld
    "lease_lost",  # see LeaseLost
    "corrupt",  # see StoreCorrupted
    "closed",  # the storage or repository was closed
    "storage",  # the backend failed (I/O, connection); the write's outcome may be unknown
]


class HarnessError(Exception):
    """Root of every exception harness_core raises on purpose."""


class SessionError(HarnessError):
    """A storage or session contract was not met.

    Tests and callers branch on `code`, never on the message text.
    """

    code: SessionErrorCode

    def __init__(self, code: SessionErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={str(self)!r})"


class LeaseHeld(SessionError):
    """Another writer holds a live lease on the session.

    Attributes:
        owner: the current holder, as it named itself when acquiring.
        expires_at_ms: when the holder's lease lapses unless renewed; None if it never lapses
            while the holder lives (an OS file lock).
    """

    owner: str
    expires_at_ms: int | None

    def __init__(self, message: str, *, owner: str, expires_at_ms: int | None) -> None:
        super().__init__("lease_held", message)
        self.owner = owner
        self.expires_at_ms = expires_at_ms


class LeaseLost(SessionError):
    """This writer's lease is no longer current: it expired, was released or was taken over.

    A writer that sees this must stop: its fencing token will never be accepted again.
    """

    def __init__(self, message: str) -> None:
        super().__init__("lease_lost", message)


class StoreCorrupted(SessionError):
    """Durable data is not a valid prefix of acknowledged writes; it is never repaired silently.

    Attributes:
        location: where the corruption was found (for example ``"/x/s.jsonl:17"``).
    """

    location: str

    def __init__(self, message: str, *, location: str) -> None:
        super().__init__("corrupt", message)
        self.location = location


class HarnessFault(HarnessError):
    """A storage write failed or an invariant broke; every call is rejected until reopened."""


class HarnessClosed(HarnessError):
    """The harness was closed while the operation was active; its durable operation stays open."""

    def __init__(
        self, message: str = "AgentHarness was closed while the operation was active"
    ) -> None:
        super().__init__(message)


class HarnessNotImplemented(HarnessError):
    """The public method exists but its work package has not landed; it never fakes success."""

    def __init__(self, member: str) -> None:
        super().__init__(f"{member} is not implemented yet")
        self.member = member


CorruptionReason = Literal[
    "multiple_open_operations",
    "unknown_operation",
    "attempts_not_consecutive",
    "compaction_reason",
    "queue_after_abort",
    "cancel_unknown_item",
    "structural_step_mismatch",
    "tool_identity_mismatch",
    "duplicate_tool_start",
    "content_mismatch",
    "branch_summary_in_run",
    "leaf_mismatch",
    "approval_mismatch",
    "drift",
]
"""Why a lane's durable log is impossible for a single writer (never repaired, never continued)."""


class RecordLogCorruption(HarnessError):
    """A lane's records and entries contradict each other; restore rejects instead of repairing."""

    def __init__(self, reason: CorruptionReason, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason: CorruptionReason = reason
