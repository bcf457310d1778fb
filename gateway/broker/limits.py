"""The blob area's bounds and content identity, shared by every broker backend (D222)."""

from __future__ import annotations

import hashlib

from pydantic import Field

from gateway.broker.contract import BlobRefused
from harness_core.frozen import Frozen

__all__ = ["BlobLimits", "blob_id"]

_DAY_MS = 86_400_000


def blob_id(data: bytes) -> str:
    """The identity of `data`: ``sha256:<hex>``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _mb(count: int) -> str:
    if count < 1000:
        return f"{count} bytes"
    return f"{count / 1_000_000:.1f} MB" if count >= 1_000_000 else f"{count / 1000:.1f} KB"


class BlobLimits(Frozen):
    """How much the blob area holds: per blob, per session, and for how long."""

    max_blob_bytes: int = Field(default=25_000_000, gt=0)
    """The largest blob (a file larger than any channel's per-file limit is refused earlier)."""
    max_session_bytes: int = Field(default=250_000_000, gt=0)
    """What one session's unexpired blobs may hold together."""
    retention_ms: int = Field(default=7 * _DAY_MS, gt=0)
    """How long a blob is kept after its last put (a message pending longer loses its files)."""

    def check_size(self, size: int) -> None:
        """Refuse a blob larger than one may be."""
        if size > self.max_blob_bytes:
            raise BlobRefused(
                "too_large", f"a file of {_mb(size)} is over the {_mb(self.max_blob_bytes)} limit"
            )

    def check_room(self, held: int, size: int) -> None:
        """Refuse a blob that would take a session over its total."""
        if held + size > self.max_session_bytes:
            raise BlobRefused(
                "full",
                f"the conversations of this space hold {_mb(held)} of files already "
                f"(at most {_mb(self.max_session_bytes)})",
            )
