"""Who may use the web channel: named tokens, sent as a bearer header or kept in a cookie.

With tokens (``[web] tokens``, D380), every request of the channel names one: an API client
sends ``Authorization: Bearer <secret>``; a browser signs in once at ``/web/login`` and keeps a
cookie. The cookie holds no secret: it is an HMAC of the token's secret, so a cookie read off a
machine does not give the secret itself (which may open other doors), and changing the secret
signs every browser out. It is ``HttpOnly`` (no script reads it), ``SameSite=Strict`` (another
site's page cannot make the browser send it: with the channel's JSON-only, same-site POSTs, no
cross-site request acts as the person) and ``Secure`` when the gateway is reached over HTTPS.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

from starlette.requests import Request

__all__ = ["COOKIE", "WebLogin"]

COOKIE = "gateway_web"
"""The sign-in cookie's name (its path is the channel's prefix)."""
_PURPOSE = b"gateway web sign-in"
_MAX_AGE_S = 30 * 24 * 3600
"""How long a browser stays signed in (then it signs in again)."""


class WebLogin:
    """The channel's tokens: who a request is (`who`), and the cookie a sign-in sets."""

    def __init__(self, tokens: Mapping[str, str]) -> None:
        """`tokens`: secret -> name (`WebSettings.logins`)."""
        self._secrets = [(secret.encode(), name) for secret, name in tokens.items()]
        self._cookies = [(_cookie(secret).encode(), name) for secret, name in tokens.items()]

    def who(self, request: Request) -> str | None:
        """The name of the token `request` carries (header or cookie), or None."""
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and given.strip():
            return _match(given.strip(), self._secrets)
        cookie = request.cookies.get(COOKIE)
        return None if cookie is None else _match(cookie, self._cookies)

    def signed_in(self, secret: str) -> tuple[str, str] | None:
        """(name, cookie value) for a secret typed at the sign-in, or None when it is no token's."""
        name = _match(secret.strip(), self._secrets)
        return None if name is None else (name, _cookie(secret.strip()))

    @staticmethod
    def cookie_header(value: str, *, path: str, secure: bool) -> str:
        """The ``Set-Cookie`` value that keeps a browser signed in (empty `value`: signs out)."""
        age = _MAX_AGE_S if value else 0
        flags = "; Secure" if secure else ""
        return f"{COOKIE}={value}; Path={path}; Max-Age={age}; HttpOnly; SameSite=Strict{flags}"


def _cookie(secret: str) -> str:
    return hmac.new(secret.encode(), _PURPOSE, hashlib.sha256).hexdigest()


def _match(given: str, known: list[tuple[bytes, str]]) -> str | None:
    """The name whose value is `given`, comparing every one in constant time."""
    try:
        raw = given.encode("ascii")
    except UnicodeEncodeError:
        return None
    found: str | None = None
    for value, name in known:
        if hmac.compare_digest(raw, value):
            found = name
    return found
