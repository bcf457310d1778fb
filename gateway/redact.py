"""Configured secrets out of every text the gateway stores, logs, renders or returns.

One `Redactor` per process, built from the settings' secrets (`Redactor.from_settings`): the
model's API key (and the provider variables its SDK reads), the Slack tokens and signing secret,
the email password and link secret, the operator tokens (and the local one), the MCP servers'
environment values, headers and tokens, and the password of every configured URL. It replaces
each, in the forms text carries it (as is, JSON-escaped, HTML-escaped, percent-encoded), with
``[redacted]``, and any ``scheme://user:password@`` password.

The boundaries that use it: the model client (`redacting`: a provider error that quotes the key
is cleaned before the harness stores it), an MCP server's tool results (before the harness
stores them or the model reads them), the log formatter (`gateway.logs.redact_with`), every
HTTP response body (`RedactBodies`), and the deliverer: every message it sends to a channel, and
its failure reasons (dead letters, audit) (D349).
"""

from __future__ import annotations

import html
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from urllib.parse import quote, quote_plus, unquote

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from config import Settings
from gateway.channels import channel_secrets
from gateway.mcp.settings import mcp_secrets
from harness_core import (
    AssistantMessage,
    DeferredHandle,
    ModelClient,
    ModelError,
    ModelInfo,
    ModelRef,
    ModelRequest,
    TokenUsage,
)
from harness_core.backends.urls import userinfo_password

__all__ = [
    "MIN_SECRET_CHARS",
    "REDACTED",
    "RedactBodies",
    "RedactingModelClient",
    "Redactor",
    "redacting",
]

REDACTED = "[redacted]"
_REDACTED_BYTES = REDACTED.encode()

MIN_SECRET_CHARS = 8
"""Shorter secrets are not searched for: "pass" would be cut out of every "password"."""

_PROVIDER_KEYS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")
"""What the providers' SDKs read when ``GATEWAY_MODEL_API_KEY`` is unset."""
_OTLP_HEADERS = ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS")
"""``key=value,...`` the span exporter sends (an ``authorization`` among them)."""
_OTLP_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")

# The userinfo of a URL: no quote, backslash, comma or space either side, so a JSON line or an
# HTML attribute it sits in stays intact. It starts with a literal, which the regex engine
# searches for quickly (a scheme first would be tried at every letter of a long body).
_URL_PASSWORD = r"(://[^\s/@:\"'\\,<>]*:)[^\s/@\"'\\,<>]+@"
_URL_PASSWORD_TEXT = re.compile(_URL_PASSWORD)
_URL_PASSWORD_BYTES = re.compile(_URL_PASSWORD.encode())
_TEXTUAL = ("text/", "application/json", "application/problem+json", "application/javascript")


def _forms(secret: str) -> set[str]:
    """`secret` as texts carry it: as is, in JSON (both escapings), in HTML, in a URL."""
    return {
        secret,
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
        html.escape(secret),
        html.escape(secret, quote=False),
        quote(secret, safe=""),
        quote_plus(secret, safe=""),
    }


def url_password(url: str | None) -> str | None:
    """The password in `url`'s userinfo (decoded), if it has one."""
    if not url or "@" not in url:
        return None
    password = userinfo_password(url)  # up to the last "@": an unencoded "#" or "@" too
    return unquote(password) if password else None


class Redactor:
    """Replaces the configured secrets in text (see the module docstring)."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets: set[str] = set()
        self._text: tuple[str, ...] = ()
        self._bytes: tuple[bytes, ...] = ()
        self.add(*secrets)

    @classmethod
    def from_settings(cls, settings: Settings, environ: Mapping[str, str] = os.environ) -> Redactor:
        """The secrets `settings` configure, and those `environ` holds for the libraries.

        From `environ`: the providers' key variables and the span exporter's headers and
        endpoint.
        """
        found: list[str] = []
        if settings.model_api_key is not None:
            found.append(settings.model_api_key.get_secret_value())
        found += channel_secrets(settings)
        found += mcp_secrets(settings)  # MCP servers' env values, headers and tokens
        for token in settings.ops_tokens:
            whole = token.get_secret_value()
            found += [whole, whole.split(":", 2)[-1]]
        for url in (
            settings.effective_store_url,
            settings.effective_broker_url,
            settings.model_base_url,
            settings.public_url,
        ):
            if (password := url_password(url)) is not None:
                found.append(password)
        found += [environ[name] for name in _PROVIDER_KEYS if environ.get(name)]
        for name in _OTLP_HEADERS:
            for pair in environ.get(name, "").split(","):
                header = unquote(pair.partition("=")[2].strip())
                found += [header, header.partition(" ")[2]]  # "Bearer x": the whole, and x
        found += [p for name in _OTLP_ENDPOINTS if (p := url_password(environ.get(name)))]
        return cls(found)

    def add(self, *secrets: str) -> None:
        """Redact `secrets` too from now on (the local operator token, made at start)."""
        self._secrets.update(s for s in secrets if len(s) >= MIN_SECRET_CHARS)
        # longest first: a secret that holds another is replaced whole
        forms = sorted({form for s in self._secrets for form in _forms(s)}, key=len, reverse=True)
        self._text = tuple(forms)
        self._bytes = tuple(form.encode() for form in forms)

    def redact(self, text: str) -> str:
        """`text` without any configured secret or URL password."""
        for form in self._text:  # a substring search per form: far faster than one alternation
            if form in text:
                text = text.replace(form, REDACTED)
        if "://" in text:
            text = _URL_PASSWORD_TEXT.sub(rf"\g<1>{REDACTED}@", text)
        return text

    def redact_bytes(self, data: bytes) -> bytes:
        """`redact` for UTF-8 bytes (a response body)."""
        for form in self._bytes:
            if form in data:
                data = data.replace(form, _REDACTED_BYTES)
        if b"://" in data:
            data = _URL_PASSWORD_BYTES.sub(rb"\g<1>" + _REDACTED_BYTES + b"@", data)
        return data


class RedactingModelClient:
    """A `ModelClient` whose errors (in band or raised) carry no configured secret.

    A provider's 401 body may quote the key it was sent; the harness stores an error message
    as it gets it (the run-failure record, the lane's error, the timeline), so it is cleaned
    here, before the harness sees it. A client that raises is answered in band, as the harness
    itself answers it, with the cleaned text.
    """

    def __init__(self, inner: ModelClient, redactor: Redactor) -> None:
        self.inner = inner
        self.redactor = redactor

    def model_info(self, model: ModelRef) -> ModelInfo | None:
        """The wrapped client's limits for `model`."""
        return self.inner.model_info(model)

    async def request(
        self,
        request: ModelRequest,
        on_update: Callable[[AssistantMessage], None] | None = None,
    ) -> AssistantMessage:
        """The wrapped client's answer, its error cleaned."""
        try:
            message = await self.inner.request(request, on_update)
        except Exception as exc:
            return self._failed(f"{type(exc).__name__}: {exc}", retryable=True)
        return self._clean(message)

    async def fetch_deferred(self, handle: DeferredHandle) -> AssistantMessage:
        """The wrapped client's answer, its error cleaned."""
        try:
            message = await self.inner.fetch_deferred(handle)
        except Exception as exc:
            return self._failed(f"deferred fetch failed: {exc}", retryable=False)
        return self._clean(message)

    async def cancel_deferred(self, handle: DeferredHandle) -> None:
        """The wrapped client's cancellation; a failure is raised with a cleaned message."""
        try:
            await self.inner.cancel_deferred(handle)
        except Exception as exc:
            raise RuntimeError(self.redactor.redact(f"{type(exc).__name__}: {exc}")) from None

    async def aclose(self) -> None:
        """Close the wrapped client's connections, if it has any to close."""
        close = getattr(self.inner, "aclose", None)
        if close is not None:
            await close()

    def _failed(self, text: str, *, retryable: bool) -> AssistantMessage:
        return AssistantMessage(
            stop_reason="error",
            error=ModelError(
                kind="unknown", message=self.redactor.redact(text), retryable=retryable
            ),
            usage=TokenUsage(),
        )

    def _clean(self, message: AssistantMessage) -> AssistantMessage:
        error = message.error
        raw = message.raw_stop_reason
        update: dict[str, object] = {}
        if error is not None and (clean := self.redactor.redact(error.message)) != error.message:
            update["error"] = error.model_copy(update={"message": clean})
        if raw is not None and (clean_raw := self.redactor.redact(raw)) != raw:
            update["raw_stop_reason"] = clean_raw
        return message.model_copy(update=update) if update else message


def redacting(client: ModelClient, redactor: Redactor) -> ModelClient:
    """`client` behind `redactor` (once: a client already behind one is returned as is)."""
    if isinstance(client, RedactingModelClient):
        return client
    return RedactingModelClient(client, redactor)


class RedactBodies:
    """Every textual response body of the app passes through the redactor.

    A body sent whole gets its ``Content-Length`` recomputed; a streamed one (the event streams)
    is cleaned chunk by chunk, each chunk being one whole event.
    """

    def __init__(self, app: ASGIApp, redactor: Redactor) -> None:
        self.app = app
        self.redactor = redactor

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app, cleaning what it sends."""
        if scope["type"] != "http" or scope.get("method") == "HEAD":
            await self.app(scope, receive, send)
            return
        held: Message | None = None
        textual = False

        async def sending(message: Message) -> None:
            nonlocal held, textual
            if message["type"] == "http.response.start":
                kind = Headers(raw=message.get("headers", [])).get("content-type", "")
                textual = kind.lower().startswith(_TEXTUAL)
                if textual:
                    held = message  # until the body's length is known
                    return
            elif message["type"] == "http.response.body" and textual:
                body = self.redactor.redact_bytes(message.get("body", b""))
                if held is not None:
                    start, held = held, None
                    headers = [
                        (k, v) for k, v in start["headers"] if k.lower() != b"content-length"
                    ]
                    if not message.get("more_body", False):
                        headers.append((b"content-length", str(len(body)).encode()))
                    await send({**start, "headers": headers})
                message = {**message, "body": body}
            await send(message)

        await self.app(scope, receive, sending)
