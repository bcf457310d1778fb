"""Who calls the operator API: bearer tokens with a name and a role, compared in constant time.

Two roles: ``viewer`` reads, ``operator`` reads and acts. A token's name is who the audit
trail says acted. With no tokens configured, a loopback-only service makes one operator token
at first start and keeps it in a file beside the embedded store (as Jupyter does), so a
newcomer signs in to ``/ops`` from the printed link without configuring anything.

`gateway ops` never sends that file's token itself: it sends a proof bound to the port it
calls (`port_bound`), which the service checks against the port the request really came in on
(D381). Whatever listens on another loopback port (a typo in ``--url``, another user's
program) learns nothing it could use on the gateway's own port.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import secrets
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from fastapi import Request

from gateway.logs import event
from gateway.ops.errors import ApiError

log = logging.getLogger("gateway.ops")

__all__ = [
    "LOCAL_TOKEN_FILE",
    "OpsAuth",
    "Principal",
    "Role",
    "local_token",
    "parse_tokens",
    "port_bound",
    "token_file",
]

Role = Literal["viewer", "operator"]
LOCAL_TOKEN_FILE = Path(".gateway/ops-token")
_PORT_BOUND = "port-bound-v1:"


def port_bound(token: str, port: int) -> str:
    """What `gateway ops` sends for the local `token` to a gateway on `port` (D381)."""
    proof = hmac.new(token.encode(), f"gateway ops, port {port}".encode(), hashlib.sha256)
    return _PORT_BOUND + proof.hexdigest()


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller."""

    name: str
    role: Role

    @property
    def actor(self) -> str:
        """How the audit trail names this caller."""
        return f"operator:{self.name}"


@dataclass(frozen=True, slots=True)
class _Token:
    principal: Principal
    digest: bytes
    secret: str


def parse_tokens(entries: Sequence[str]) -> list[tuple[str, Role, str]]:
    """``name:role:secret`` entries (checked by the settings) as (name, role, secret)."""
    parsed: list[tuple[str, Role, str]] = []
    for entry in entries:
        name, role, secret = entry.split(":", 2)
        parsed.append((name, "operator" if role == "operator" else "viewer", secret))
    return parsed


class OpsAuth:
    """Checks bearer tokens against the configured ones."""

    def __init__(self, tokens: Sequence[tuple[str, Role, str]]) -> None:
        if not tokens:
            raise ValueError("the operator API needs at least one token")
        self._tokens = [
            _Token(Principal(name, role), hashlib.sha256(secret.encode()).digest(), secret)
            for name, role, secret in tokens
        ]

    def principal(self, request: Request) -> Principal:
        """The caller, or `ApiError` 401 (no token, or not one of ours)."""
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise ApiError(401, "unauthenticated", "send Authorization: Bearer <token>")
        given = given.strip()
        found: Principal | None = None
        if given.startswith(_PORT_BOUND):
            # the port the connection came in on, never one the request names (its Host)
            server = request.scope.get("server")
            port = server[1] if server and isinstance(server[1], int) else None
            if port is not None:
                for token in self._tokens:
                    proof = port_bound(token.secret, port).encode()
                    if hmac.compare_digest(proof, given.encode()):
                        found = token.principal
        else:
            digest = hashlib.sha256(given.encode()).digest()
            for token in self._tokens:  # every token is compared: the time says nothing
                if hmac.compare_digest(token.digest, digest):
                    found = token.principal
        if found is None:
            raise ApiError(401, "unauthenticated", "the token is not valid")
        return found

    def require(self, request: Request, role: Role) -> Principal:
        """The caller, if its role allows `role` (operators may also view)."""
        return self.allow(self.principal(request), role)

    def allow(self, principal: Principal, role: Role) -> Principal:
        """`principal`, if its role allows `role`; `ApiError` 403 otherwise."""
        if role == "operator" and principal.role != "operator":
            raise ApiError(
                403, "forbidden", f"{principal.name} is a viewer: acting needs an operator token"
            )
        return principal


def token_file(store_url: str) -> Path | None:
    """Where the local token is kept: beside a file store (sqlite, jsonl); None for the others.

    A Redis deployment runs several processes that must share their tokens: it configures
    ``GATEWAY_OPS_TOKENS`` (without them each process makes a token of its own for its life).
    """
    scheme, _, rest = store_url.partition("?")[0].partition("://")
    if scheme not in ("sqlite", "jsonl"):
        return None
    location = Path(rest[1:] if rest.startswith("/") else rest).expanduser()
    folder = location.parent if scheme == "sqlite" else location
    return folder / LOCAL_TOKEN_FILE.name


def local_token(path: Path | None) -> tuple[str, bool]:
    """The embedded service's operator token, made at first start; (token, kept on disk).

    Kept in `path` (mode 0600) so it survives restarts; with no path, or where it cannot be
    written (a read-only directory), the token lives as long as the process. A kept token is
    used only from a regular file of this process's own user that no other user can read;
    anything else at the path (a file others could read, another user's, a symbolic link, a
    FIFO) is replaced, never written through nor read as the token (D343, D375).
    """
    if path is None:
        return secrets.token_urlsafe(32), False
    kept = _kept_token(path)
    if kept is not None:
        return kept, True
    token = secrets.token_urlsafe(32)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a link itself, not what it names: written anew below
        # O_EXCL and O_NOFOLLOW: what appears at the path meanwhile is never written through
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        descriptor = os.open(path, flags, 0o600)
        with os.fdopen(descriptor, "w", encoding="ascii") as handle:
            handle.write(token + "\n")
    except OSError:
        return token, False
    return token, True


def _kept_token(path: Path) -> str | None:
    """The token kept at `path`, if the file there may be trusted with it (else None)."""
    try:
        # O_NONBLOCK: a FIFO someone made there does not hold the start
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        if path.is_symlink():
            _replaced(path, "it was a symbolic link (a token is never written through one)")
        return None
    with os.fdopen(descriptor, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            _replaced(path, "it was not a regular file")
            return None
        if info.st_uid != os.getuid():
            _replaced(path, f"another user (uid {info.st_uid}) owned it")
            return None
        if info.st_mode & 0o077:
            _replaced(
                path,
                "the file could be read by other users than its owner (its mode was "
                f"{info.st_mode & 0o777:o}): a new token, readable by the owner only",
            )
            return None
        try:
            text = handle.read(4096).decode("ascii").strip()
        except (OSError, UnicodeDecodeError):
            return None
    return text if len(text) >= 24 else None


def _replaced(path: Path, why: str) -> None:
    log.warning(event("ops token replaced", file=str(path), why=why))
