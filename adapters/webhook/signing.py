"""Standard Webhooks signatures (standardwebhooks.com, v1: HMAC-SHA256), both directions.

The signed content is ``{webhook-id}.{webhook-timestamp}.{raw body}``; the signature header is
a space-separated list of ``v1,<base64 HMAC>`` (more than one during a secret's rotation); the
secret is ``whsec_<base64 of 24 to 64 random bytes>``. A receiver checks the timestamp against
its own clock (5 minutes either way by default) before it looks at the body, so a request
captured once cannot be replayed later, and compares signatures in constant time.

Written here rather than taken from the `standardwebhooks` package (decision D195): the check
reads the injected clock, and every malformed header is one refusal, never an exception of
another kind.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Iterable, Mapping
from typing import Literal

from adapters.errors import AdapterError

__all__ = [
    "MAX_SECRET_BYTES",
    "MIN_SECRET_BYTES",
    "SECRET_PREFIX",
    "SignatureRefused",
    "check_headers",
    "secret_key",
    "sign",
    "signed_headers",
    "verify",
]

SECRET_PREFIX = "whsec_"
MIN_SECRET_BYTES = 24
"""The spec's least key size (192 bits)."""
MAX_SECRET_BYTES = 64
"""The spec's largest key size (512 bits)."""

_ID = re.compile(r"[A-Za-z0-9_:@+=-]{1,200}")
"""A webhook-id we take: no ``.`` (the spec: the content is split at dots), no spaces."""
_TIMESTAMP = re.compile(r"[0-9]{1,12}")

RefusalCode = Literal["unsigned", "invalid_webhook_id", "stale_timestamp", "bad_signature"]


class SignatureRefused(AdapterError):
    """A request whose signature headers do not verify; `code` says which check failed."""

    def __init__(self, code: RefusalCode, message: str) -> None:
        super().__init__(message)
        self.code: RefusalCode = code
        self.message = message


_MIN_DISTINCT_BYTES = 8
"""Fewer distinct byte values than this is no random key (24 random bytes have about 23)."""


def secret_key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_<base64>`` secret.

    Raises:
        ValueError: not ``whsec_`` and standard base64 of 24 to 64 bytes (the words say which).
    """
    secret = secret.strip()  # pasted from a file, with its line break: base64 has no spaces
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError(f"a secret starts with {SECRET_PREFIX}")
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"the part after {SECRET_PREFIX} is not base64") from None
    if not MIN_SECRET_BYTES <= len(key) <= MAX_SECRET_BYTES:
        raise ValueError(
            f"the key is {len(key)} bytes; the spec asks for {MIN_SECRET_BYTES} to "
            f"{MAX_SECRET_BYTES} random bytes"
        )
    if len(set(key)) < _MIN_DISTINCT_BYTES:  # 32 zero bytes passed: anyone could sign
        raise ValueError(
            f"the key's bytes are not random ({len(set(key))} distinct values in {len(key)}): "
            "make one with openssl rand -base64 32"
        )
    return key


def sign(key: bytes, msg_id: str, timestamp_s: int, body: bytes) -> str:
    """The ``v1,<base64>`` signature of `body` sent as `msg_id` at `timestamp_s`."""
    content = f"{msg_id}.{timestamp_s}.".encode() + body
    digest = hmac.new(key, content, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def signed_headers(key: bytes, msg_id: str, timestamp_s: int, body: bytes) -> dict[str, str]:
    """The three Standard Webhooks headers of a request carrying `body`."""
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp_s),
        "webhook-signature": sign(key, msg_id, timestamp_s, body),
    }


def check_headers(
    headers: Mapping[str, str], *, now_s: int, tolerance_s: int
) -> tuple[str, int, str]:
    """The id, timestamp and signature list of a request, checked before its body is read.

    Raises:
        SignatureRefused: a header is missing (``unsigned``), the id is not one we take, or the
            timestamp is not within `tolerance_s` of `now_s` (``stale_timestamp``).
    """
    msg_id = headers.get("webhook-id")
    timestamp = headers.get("webhook-timestamp")
    signatures = headers.get("webhook-signature")
    if not msg_id or not timestamp or not signatures:
        raise SignatureRefused(
            "unsigned",
            "the request is not signed: webhook-id, webhook-timestamp and webhook-signature "
            "are required (Standard Webhooks)",
        )
    if not _ID.fullmatch(msg_id):
        raise SignatureRefused(
            "invalid_webhook_id",
            "webhook-id must be 1-200 of ASCII letters, digits and _ : @ + = - (no dots)",
        )
    if not _TIMESTAMP.fullmatch(timestamp):
        raise SignatureRefused("stale_timestamp", "webhook-timestamp must be whole Unix seconds")
    sent = int(timestamp)
    if abs(now_s - sent) > tolerance_s:
        raise SignatureRefused(
            "stale_timestamp",
            f"webhook-timestamp is {now_s - sent} s from this gateway's clock; at most "
            f"{tolerance_s} s either way is accepted (sign each attempt anew)",
        )
    return msg_id, sent, signatures


def verify(
    keys: Iterable[bytes], msg_id: str, timestamp_s: int, signatures: str, body: bytes
) -> None:
    """Pass if one ``v1`` signature in `signatures` is `body`'s under one of `keys`.

    Entries of other versions (``v1a``, later ones) and malformed entries are skipped, as the
    spec asks; every comparison is constant time.

    Raises:
        SignatureRefused: ``bad_signature``.
    """
    given: list[bytes] = []
    for entry in signatures.split(" ")[:16]:
        version, _, encoded = entry.partition(",")
        if version != "v1":
            continue
        try:
            given.append(base64.b64decode(encoded, validate=True))
        except (binascii.Error, ValueError):
            continue
    for key in keys:
        expected = sign(key, msg_id, timestamp_s, body).partition(",")[2]
        digest = base64.b64decode(expected)
        if any(hmac.compare_digest(digest, candidate) for candidate in given):
            return
    raise SignatureRefused(
        "bad_signature", "no webhook-signature matches this request under the shared secret"
    )
