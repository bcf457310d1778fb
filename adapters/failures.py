"""Why a server could not be reached, in words: one line naming the host and the port.

An operator reads these lines in the log and in a delivery's failure reason (`gateway ops`,
``/ops``); they say what happened (the name does not resolve, nothing listens on the port, the
TLS handshake failed and why, the server said nothing within the timeout) and what to check,
never a password or a token (decisions D171, D172). The exception's chain is read from its root
(aiosmtplib and aiohttp wrap the socket's error; aioimaplib raises it as it is): the root cause
has the words.
"""

from __future__ import annotations

import re
import socket
import ssl

__all__ = ["connection_failure", "tls_reason"]

_OTHER_NAME = frozenset({62, 64})  # OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH, IP_ADDRESS_MISMATCH
_NOT_NOW = frozenset({9, 10})  # X509_V_ERR_CERT_NOT_YET_VALID, CERT_HAS_EXPIRED
_SSL_NOISE = re.compile(r"^\[[^\]]*\]\s*|\s*\(_ssl\.c:\d+\)$")
_TLS_HINTS = {
    "WRONG_VERSION_NUMBER": "the server does not speak TLS on this port: check the port and "
    "its security setting",
    "UNEXPECTED_EOF_WHILE_READING": "the server closed the connection",
    "TLSV1_ALERT_PROTOCOL_VERSION": "no TLS version both sides accept",
    "SSLV3_ALERT_HANDSHAKE_FAILURE": "no cipher both sides accept",
}


def tls_reason(error: ssl.SSLError, *, ca_hint: str | None = None) -> str:
    """What an `ssl.SSLError` says, without OpenSSL's codes and source lines.

    `ca_hint` closes an untrusted certificate's words (where a private CA can be trusted).
    """
    if isinstance(error, ssl.SSLCertVerificationError):
        said = str(error.verify_message or "").strip().rstrip(".") or "it does not verify"
        if error.verify_code in _OTHER_NAME:
            return f"its certificate is for another name ({said}): check the host name"
        if error.verify_code in _NOT_NOW:
            return f"its certificate is not valid now ({said})"
        return f"its certificate is not trusted ({said}{'; ' + ca_hint if ca_hint else ''})"
    code = str(getattr(error, "reason", None) or "")
    hint = _TLS_HINTS.get(code)
    text = _SSL_NOISE.sub("", str(error.args[1] if len(error.args) > 1 else error)).strip()
    text = text or (code or type(error).__name__).lower().replace("_", " ")
    return f"{text} ({hint})" if hint else text


def connection_failure(
    error: BaseException,
    *,
    protocol: str,
    host: str,
    port: int,
    timeout_s: float,
    phase: str,
    ca_hint: str | None = None,
) -> str:
    """One line saying why `protocol` at `host`:`port` failed during `phase` (``connecting``...).

    Args:
        error: what was raised (its causes are read too).
        protocol: ``IMAP`` or ``SMTP``.
        host: the server's host, as configured.
        port: its port.
        timeout_s: the bound every call has (said when it ran out).
        phase: what the client was doing: ``connecting``, ``logging in``, ``STARTTLS``...
        ca_hint: where a private CA can be trusted (said with an untrusted certificate).
    """
    where = f"{host}:{port}"
    chain = _chain(error)
    for cause in reversed(chain):  # the root cause first: wrappers say less
        if isinstance(cause, socket.gaierror):
            why = cause.strerror or "no such name"
            return f"cannot resolve the {protocol} host {host!r} ({why}): check the host name"
        if isinstance(cause, ConnectionRefusedError):
            return (
                f"connection refused by {where}: nothing listens there (check the {protocol} "
                "host and port)"
            )
        if isinstance(cause, ssl.SSLError):
            why = tls_reason(cause, ca_hint=ca_hint)
            return f"TLS handshake with {protocol} server {where} failed: {why}"
        if isinstance(cause, TimeoutError):
            return f"no answer from {protocol} server {where} within {timeout_s:g} s ({phase})"
        if isinstance(cause, (ConnectionResetError, BrokenPipeError, EOFError)):
            return f"{protocol} server {where} closed the connection ({phase})"
    for cause in reversed(chain):
        if isinstance(cause, OSError) and cause.strerror:
            return f"cannot reach {protocol} server {where}: {cause.strerror} ({phase})"
        if isinstance(cause, ConnectionError):
            return f"{protocol} server {where} closed the connection ({phase})"
    return f"{protocol} server {where} failed ({phase}: {type(error).__name__})"


def _chain(error: BaseException) -> list[BaseException]:
    """`error` and its causes, outermost first (bounded: a chain can loop)."""
    found: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in found and len(found) < 10:
        found.append(current)
        current = current.__cause__ or current.__context__
    return found
