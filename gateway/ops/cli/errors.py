"""How a ``gateway ops`` command ends: its exit statuses and the one error it fails with."""

from __future__ import annotations

from gateway.errors import StatusError

__all__ = ["FAILED", "INTERRUPTED", "OK", "UNREACHABLE", "USAGE", "OpsError"]

OK, FAILED, USAGE, UNREACHABLE, INTERRUPTED = 0, 1, 2, 3, 130


class OpsError(StatusError):
    """A failure reported as one line on stderr, with the exit status.

    `code`: the API's error code when the gateway refused the request (``not_found``...).
    """

    def __init__(self, message: str, status: int = FAILED, *, code: str | None = None) -> None:
        super().__init__(message, status)
        self.message = message
        self.code = code
