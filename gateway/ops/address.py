"""Where the embedded service listens, kept beside its store so `gateway ops` finds it.

`gateway serve --port 9000` (or ``GATEWAY_PORT`` set in one shell only) served on a port the
settings do not name, and `gateway ops` from the same directory called 8787 and could not
reach it (an outside probe). The service writes the address it serves at into
``.gateway/ops-address`` beside a file store (as it keeps the operator token there), and the
operator CLI reads it before the settings' host and port. Read only from a regular file of the
reader's own user that nobody else may write: an address planted there would have carried a
``GATEWAY_OPS_TOKEN`` to another program's port.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from gateway.ops.auth import token_file

__all__ = ["address_file", "connect_host", "forget_address", "keep_address", "kept_address"]

_NAME = "ops-address"
_WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1", "": "127.0.0.1"}


def connect_host(host: str) -> str:
    """The host a client on this machine calls for a service listening on `host`."""
    return _WILDCARDS.get(host, host)


def address_file(store_url: str) -> Path | None:
    """Where the address is kept: beside a file store's token (None for the others)."""
    token = token_file(store_url)
    return token.with_name(_NAME) if token is not None else None


def keep_address(path: Path | None, url: str) -> None:
    """Write `url` at `path` (whole, by a rename); best effort: the CLI then asks the settings."""
    if path is None:
        return
    part = path.with_name(f"{_NAME}.{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            part.unlink()
        descriptor = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(descriptor, "w", encoding="ascii") as handle:
            handle.write(url + "\n")
        os.replace(part, path)
    except (OSError, UnicodeEncodeError):
        with contextlib.suppress(OSError):
            part.unlink()


def forget_address(path: Path | None, url: str) -> None:
    """Remove the kept address at a stop, if it is still `url` (no later start's)."""
    if path is not None and kept_address(path) == url:
        with contextlib.suppress(OSError):
            path.unlink()


def kept_address(path: Path | None) -> str | None:
    """The address kept at `path`, if the file there may be trusted (else None)."""
    if path is None:
        return None
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(descriptor, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
            return None
        try:
            text = handle.read(512).decode("ascii").strip()
        except (OSError, UnicodeDecodeError):
            return None
    return text or None
