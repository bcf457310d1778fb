"""Configured secrets never stored, logged, rendered or returned (one redactor, every boundary).

The whole service runs against a fake provider that answers 401 quoting the API key it was sent
(as some OpenAI-compatible servers do) and a channel whose delivery error quotes the Slack bot
token; the key and the token are then looked for everywhere: the store's and the broker's files,
every log line, every operator API read, the pages and the thread. Then the redactor itself:
every kind of configured secret, the forms text carries it in, URL passwords, the log
formatter, streamed response bodies and a model client that raises. Each table is one line a
case.
"""

from __future__ import annotations

import asyncio
import html
import json
import logging
import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import httpx
import pytest
from pydantic import SecretStr

from adapters.testing import RecordingChannel
from adapters.web import WebChannel, open_mailbox
from adapters.web.settings import web_mailbox_url
from config import Settings
from gateway.channels import gateway_settings
from gateway.logs import JsonFormatter, event, redact_with
from gateway.ops.auth import local_token
from gateway.redact import REDACTED, RedactBodies, Redactor, redacting
from gateway.serve import banner
from gateway.service import Service, ServiceParts
from harness_core import AssistantMessage, DeferredHandle, ModelInfo, ModelRef, ModelRequest
from tests.support.fake_llm import FakeLLM, allow_model_requests
from tests.support.service_rig import ServiceRig, serving

KEY = "sk-echoed-model-key-0123456789abcdef"
BOT = "xoxb-1234-5678-echoedbottoken"
OPERATOR = "operator-secret-abcdefghijklmnop"
AS_OPERATOR = {"Authorization": f"Bearer {OPERATOR}"}
LEAKS = (KEY, BOT, OPERATOR)


@pytest.fixture
def captured() -> Iterator[list[str]]:
    """Every log line any logger writes during the test, as the service's formatter writes it."""
    lines: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    handler = Capture()
    handler.setFormatter(JsonFormatter())
    loggers = [logging.getLogger(name) for name in ("", "gateway", "adapters", "harness_core")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
    try:
        yield lines
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.removeHandler(handler)
            logger.setLevel(level)


@pytest.fixture
async def echoing(tmp_path: Path) -> AsyncIterator[tuple[ServiceRig, RecordingChannel, FakeLLM]]:
    async with FakeLLM() as provider:
        settings = gateway_settings(
            store_url=f"sqlite:///{tmp_path}/store.db",
            broker_url=f"sqlite:///{tmp_path}/broker.db",
            web_url=f"sqlite:///{tmp_path}/web.db",
            model="openai:test-model",
            model_api_key=SecretStr(KEY),
            model_base_url=provider.openai_base_url,
            slack_bot_token=SecretStr(BOT),
            slack_signing_secret=SecretStr("slack-signing-secret-0123"),
            ops_tokens=(f"alice:operator:{OPERATOR}",),
            outbox_max_attempts=1,
        )
        other = RecordingChannel("other")
        other.fail_always(reason=f"Slack answered invalid_auth for {BOT}")
        web = WebChannel(open_mailbox(web_mailbox_url(settings)))
        service = Service(settings, ServiceParts(adapters=[web, other]))
        with allow_model_requests():
            await service.start()
            assert service.app is not None
            transport = httpx.ASGITransport(app=service.app)
            try:
                async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as h:
                    yield ServiceRig(service, h), other, provider
            finally:
                await service.stop(drain_seconds=2)


async def _dead_letters(rig: ServiceRig, count: int) -> list[dict[str, Any]]:
    deadline = asyncio.get_running_loop().time() + 15
    while True:
        found = await rig.http.get("/api/v1/deliveries", headers=AS_OPERATOR)
        items: list[dict[str, Any]] = found.json()["items"]
        if len(items) >= count:
            return items
        assert asyncio.get_running_loop().time() < deadline, items
        await asyncio.sleep(0.05)


async def test_a_provider_that_echoes_the_key_leaves_it_nowhere(
    echoing: tuple[ServiceRig, RecordingChannel, FakeLLM], captured: list[str], tmp_path: Path
) -> None:
    rig, other, provider = echoing
    provider.fail(401, echo_key=True)
    provider.fail(401, echo_key=True)
    await rig.post("t1", "hello")
    [notice] = await rig.answers("t1", 1)
    await other.send("o1", "hello too")
    [dead] = await _dead_letters(rig, 1)
    assert provider.requests[0].headers["authorization"] == f"Bearer {KEY}"  # it was sent...

    lanes = (await rig.http.get("/api/v1/lanes", headers=AS_OPERATOR)).json()["items"]
    web_lane = next(v for v in lanes if v["lane"] == "web:t1")
    error = web_lane["error"]["message"]
    assert "HTTP 401" in error and REDACTED in error, error  # ...and is said to be wrong
    assert REDACTED in dead["last_error"], dead

    reads = [
        "/api/v1/sessions",
        "/api/v1/lanes",
        f"/api/v1/lanes/{web_lane['id']}",
        f"/api/v1/lanes/{web_lane['id']}/timeline",
        f"/api/v1/lanes/{web_lane['id']}/usage",
        "/api/v1/deliveries",
        f"/api/v1/deliveries/{dead['id']}",
        "/api/v1/audit",
        "/api/v1/backlog",
        "/web/threads/t1",
        "/web/threads?space=default",
        "/web/threads/t1/page",
        "/web/",
        "/ops",
        "/metrics",
        "/readyz",
    ]
    places: dict[str, str] = {"the thread's notice": json.dumps(notice)}
    for path in reads:
        response = await rig.http.get(path, headers=AS_OPERATOR)
        assert response.status_code == 200, (path, response.text)
        places[path] = response.text
    await rig.service.stop(drain_seconds=1)  # every write on disk
    places.update(await asyncio.to_thread(_files, tmp_path))
    places["the log"] = "\n".join(captured)
    assert captured, "nothing was logged"
    for place, text in places.items():
        for secret in LEAKS:
            assert secret not in text, (place, secret)


def _files(where: Path) -> dict[str, str]:
    """Every file the service wrote (databases, their journals), as text."""
    return {file.name: file.read_bytes().decode("latin-1") for file in sorted(where.iterdir())}


# -- the redactor --------------------------------------------------------------------------------

_BASE: dict[str, Any] = {
    "slack_bot_token": "xoxb-base-token-000000",
    "slack_signing_secret": "base-signing-secret-0000",
}
SECRETS: list[tuple[dict[str, Any], str]] = [
    # (settings, a secret they configure)
    ({"model_api_key": "sk-model-key-0123456789"}, "sk-model-key-0123456789"),
    ({"slack_bot_token": "xoxb-1111-2222-abcdefgh"}, "xoxb-1111-2222-abcdefgh"),
    ({"slack_signing_secret": "8f1e2d3c4b5a69788796a5b4"}, "8f1e2d3c4b5a69788796a5b4"),
    ({"slack_app_token": "xapp-1-A0-123-abcdef0123"}, "xapp-1-A0-123-abcdef0123"),
    (
        {
            "email_address": "bot@example.test",
            "email_imap_host": "imap.example.test",
            "email_smtp_host": "smtp.example.test",
            "email_password": 'mail-pass&word"<0123>',
        },
        'mail-pass&word"<0123>',
    ),
    (
        {  # a link secret works only beside the mailbox (an address alone is refused)
            "email_address": "bot@example.test",
            "email_imap_host": "imap.example.test",
            "email_smtp_host": "smtp.example.test",
            "email_password": "mail-password",
            "email_link_secret": "link-secret-" + "x" * 32,
        },
        "link-secret-" + "x" * 32,
    ),
    ({"ops_tokens": "alice:operator:ops-secret-of-24-characters"}, "ops-secret-of-24-characters"),
    (
        {"ops_tokens": "alice:operator:ops-secret-of-24-characters"},
        "alice:operator:ops-secret-of-24-characters",
    ),
    ({"redis_url": "redis://:redis-pass-0123@cache:6379/0"}, "redis-pass-0123"),
    ({"store_url": "redis://user:store%2Fpass%400123@h:6379/0"}, "store/pass@0123"),
    ({"broker_url": "rediss://u:broker-pass-0123@h:6380/0"}, "broker-pass-0123"),
    ({"web_url": "redis+cluster://:web-pass-01234@h:7000"}, "web-pass-01234"),
    ({"model_base_url": "https://u:proxy-pass-0123@proxy.example/v1"}, "proxy-pass-0123"),
]
FORMS: list[Callable[[str], str]] = [
    lambda s: f"HTTP 401: Incorrect API key provided: {s}.",
    lambda s: json.dumps({"error": {"message": s}}),
    lambda s: json.dumps({"error": {"message": s}}, ensure_ascii=False),
    lambda s: f"<p>{html.escape(s)}</p>",
    lambda s: f"https://example.test/?key={quote(s, safe='')}",
    lambda s: f"key={quote_plus(s)}",
    lambda s: f"{s}{s}",
]


@pytest.mark.parametrize(("configured", "secret"), SECRETS)
def test_every_configured_secret_is_redacted_in_every_form(
    configured: dict[str, Any], secret: str
) -> None:
    redactor = Redactor.from_settings(gateway_settings(**{**_BASE, **configured}), environ={})
    for form in FORMS:
        text = form(secret)
        cleaned = redactor.redact(text)
        assert secret not in cleaned and REDACTED in cleaned, (text, cleaned)
        assert redactor.redact_bytes(text.encode()) == cleaned.encode()
        for piece in (quote(secret, safe=""), html.escape(secret), json.dumps(secret)[1:-1]):
            assert piece not in cleaned or len(piece) < 8, (text, cleaned)


ENVIRONMENT: list[tuple[dict[str, str], str]] = [
    # (variables the libraries read, a secret they hold)
    ({"OPENAI_API_KEY": "sk-from-env-0123"}, "sk-from-env-0123"),
    ({"ANTHROPIC_API_KEY": "sk-ant-from-env-0123"}, "sk-ant-from-env-0123"),
    ({"OTEL_EXPORTER_OTLP_HEADERS": "x-team=a,api-key=otlp-key-0123"}, "otlp-key-0123"),
    (
        {"OTEL_EXPORTER_OTLP_TRACES_HEADERS": "Authorization=Bearer%20otlp-token-0123"},
        "otlp-token-0123",
    ),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "https://u:otlp-pass-0123@collector:4318"}, "otlp-pass-0123"),
]


@pytest.mark.parametrize(("environ", "secret"), ENVIRONMENT)
def test_the_secrets_libraries_read_from_the_environment_are_secrets_too(
    environ: dict[str, str], secret: str
) -> None:
    redactor = Redactor.from_settings(Settings(), environ=environ)
    assert redactor.redact(f"refused {secret}") == f"refused {REDACTED}"


TEXTS: list[tuple[str, str]] = [
    # (text, what the redactor makes of it with no secret configured)
    ("redis://:hunter2@cache:6379/0", f"redis://:{REDACTED}@cache:6379/0"),
    ("see postgres://app:s3cret@db/main.", f"see postgres://app:{REDACTED}@db/main."),
    ('{"url":"http://u:p@h","x":"a@b"}', f'{{"url":"http://u:{REDACTED}@h","x":"a@b"}}'),
    ('{"a":"x://b:c","d":"e@f"}', '{"a":"x://b:c","d":"e@f"}'),  # never across a JSON string
    ("http://host/path@x and mailto:a@b.c", "http://host/path@x and mailto:a@b.c"),
    ("http://user@host:8080/", "http://user@host:8080/"),
    ("no secrets here", "no secrets here"),
    ("", ""),
]


@pytest.mark.parametrize(("text", "cleaned"), TEXTS)
def test_passwords_in_urls_are_redacted_and_nothing_else(text: str, cleaned: str) -> None:
    assert Redactor().redact(text) == cleaned
    assert Redactor().redact_bytes(text.encode()) == cleaned.encode()


def test_a_secret_too_short_to_tell_from_words_is_not_searched_for() -> None:
    redactor = Redactor(["pass", "sk-long-enough"])
    assert redactor.redact("password sk-long-enough") == f"password {REDACTED}"


def test_the_log_formatter_passes_every_line_through_the_redactor() -> None:
    logger = logging.getLogger("gateway.test_secrets")
    record = logger.makeRecord(
        logger.name,
        logging.WARNING,
        __file__,
        1,
        event("model failed", reason=f"bad key {KEY}", url="redis://:pw-0123456@h"),
        (),
        None,
        extra={"detail": {"nested": [KEY]}},
    )
    remove = redact_with(Redactor([KEY]).redact)
    try:
        line = JsonFormatter().format(record)
    finally:
        remove()
    assert KEY not in line and "pw-0123456" not in line
    parsed = json.loads(line)
    assert parsed["reason"] == f"bad key {REDACTED}" and parsed["detail"] == {"nested": [REDACTED]}
    assert KEY in JsonFormatter().format(record)  # removed: the hook is the service's


async def test_response_bodies_are_redacted_whole_or_streamed() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        path = scope["path"]
        if path == "/json":
            body = json.dumps({"error": f"bad key {KEY}"}).encode()
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(body)),
            ]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})
        elif path == "/events":
            headers = [(b"content-type", b"text/event-stream")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            for n in range(3):
                chunk = f"id: {n}\ndata: {KEY}\n\n".encode()
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        else:
            headers = [(b"content-type", b"application/octet-stream")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": KEY.encode()})

    guarded = RedactBodies(app, Redactor([KEY]))
    transport = httpx.ASGITransport(app=guarded)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
        whole = await http.get("/json")
        assert whole.json() == {"error": f"bad key {REDACTED}"}
        assert int(whole.headers["content-length"]) == len(whole.content)
        streamed = await http.get("/events")
        assert streamed.text == "".join(f"id: {n}\ndata: {REDACTED}\n\n" for n in range(3))
        assert (await http.get("/binary")).content == KEY.encode()  # not text: left alone


class _Raising:
    """A model client that raises with the key in every message (a careless plugin's)."""

    def model_info(self, model: ModelRef) -> ModelInfo | None:
        return None

    async def request(self, request: ModelRequest, on_update: Any = None) -> AssistantMessage:
        raise RuntimeError(f"the proxy refused key {KEY}")

    async def fetch_deferred(self, handle: DeferredHandle) -> AssistantMessage:
        raise RuntimeError(f"no job for key {KEY}")

    async def cancel_deferred(self, handle: DeferredHandle) -> None:
        raise RuntimeError(f"cannot cancel for key {KEY}")

    closed = False

    async def aclose(self) -> None:
        self.closed = True


async def test_a_model_client_that_raises_is_answered_in_band_without_the_key() -> None:
    redactor = Redactor([KEY])
    inner = _Raising()
    client = redacting(inner, redactor)
    assert redacting(client, redactor) is client
    request = ModelRequest(model=ModelRef(provider="scripted", model_id="x"), messages=())
    answer = await client.request(request)
    assert answer.stop_reason == "error" and answer.error is not None
    assert answer.error.message == f"RuntimeError: the proxy refused key {REDACTED}"
    assert answer.error.retryable
    handle = DeferredHandle(provider="scripted", model="x", id="job-1")
    fetched = await client.fetch_deferred(handle)
    assert fetched.error is not None and KEY not in fetched.error.message
    with pytest.raises(RuntimeError) as caught:
        await client.cancel_deferred(handle)
    assert KEY not in str(caught.value) and REDACTED in str(caught.value)
    await client.aclose()  # type: ignore[attr-defined]  # `gateway ask` closes what it made
    assert inner.closed


def test_the_banner_prints_the_local_token_only_to_a_terminal(tmp_path: Path) -> None:
    """An outside probe found the sign-in link, the operator token in it, in the service's log
    (stderr, as a container or a service manager keeps it)."""
    settings = gateway_settings(host="::1", port=8787)
    kept = tmp_path / "ops-token"
    token = "a-local-operator-token-0123456789"
    shown = banner(settings, "scripted:echo", token, kept, terminal=True)
    assert f"http://[::1]:8787/ops#token={token}  (the operator token, kept in {kept})" in shown
    logged = banner(settings, "scripted:echo", token, kept, terminal=False)
    assert token not in logged
    assert f"http://[::1]:8787/ops (sign in with the operator token kept in {kept})" in logged
    # a token kept nowhere (Redis, memory://, a read-only directory) is shown to a terminal
    # only: it was printed into the log, where more people than the operators read it
    assert token in banner(settings, "scripted:echo", token, None, terminal=True)
    unkept = banner(settings, "scripted:echo", token, None, terminal=False)
    assert token not in unkept and "set GATEWAY_OPS_TOKENS to sign in" in unkept


async def test_the_store_s_files_and_the_token_file_are_the_owner_s_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The databases were 0644 (every conversation readable by any local user) beside a 0600
    token file; a token file someone made readable was used without a word."""
    settings = gateway_settings(
        store_url=f"sqlite:///{tmp_path}/gw/store.db",
        broker_url=f"sqlite:///{tmp_path}/gw/broker.db",
        web_url=f"sqlite:///{tmp_path}/gw/web.db",
    )
    async with serving(settings) as rig:
        assert (await rig.http.post("/web/threads/t/messages", json={"text": "hi"})).is_success
    folder = tmp_path / "gw"
    modes = {p.name: p.stat().st_mode & 0o777 for p in folder.iterdir()}
    assert modes["store.db"] == modes["broker.db"] == modes["web.db"] == 0o600, modes
    assert all(mode == 0o600 for mode in modes.values()), modes  # -wal, -shm, the token
    token_file = folder / "ops-token"
    first = token_file.read_text().strip()
    token_file.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="gateway.ops"):
        async with serving(settings) as rig:
            assert rig.service.ops_sign_in is not None
            assert first not in rig.service.ops_sign_in  # a token others may have read
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert token_file.read_text().strip() != first
    said = [r.getMessage() for r in caplog.records if r.name == "gateway.ops"]
    assert said == ["ops token replaced"]


def test_the_token_file_is_never_written_through_a_link_nor_taken_from_another_s_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`serve` wrote its token through a symbolic link at the token's path (it overwrote a
    machine's /etc/hostname), took a 0600 secret file a link named as its operator token, and
    took a token file another local user planted (an outside probe)."""
    victim = tmp_path / "victim.txt"
    victim.write_text("important short\n")
    link = tmp_path / "a" / "ops-token"
    link.parent.mkdir()
    link.symlink_to(victim)
    with caplog.at_level(logging.WARNING, logger="gateway.ops"):
        token, kept = local_token(link)
    assert victim.read_text() == "important short\n"  # not written through
    assert kept and not link.is_symlink() and link.read_text().strip() == token
    [said] = [r for r in caplog.records if r.name == "gateway.ops"]
    assert "symbolic link" in JsonFormatter().format(said)

    secret = tmp_path / "api-key"
    secret.write_text("sk-live-0123456789abcdefghijklmnop\n")
    secret.chmod(0o600)
    named = tmp_path / "b" / "ops-token"
    named.parent.mkdir()
    named.symlink_to(secret)
    token, _ = local_token(named)
    assert token != "sk-live-0123456789abcdefghijklmnop"  # a linked secret is no token
    assert secret.read_text() == "sk-live-0123456789abcdefghijklmnop\n"

    fifo = tmp_path / "c" / "ops-token"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    token, kept = local_token(fifo)  # no hang on a FIFO
    assert kept and fifo.is_file() and fifo.read_text().strip() == token


@pytest.mark.skipif(os.getuid() != 0, reason="planting another user's file needs root")
def test_a_token_file_another_user_planted_is_replaced(tmp_path: Path) -> None:
    planted = tmp_path / "ops-token"
    planted.write_text("chosen-by-somebody-else-0123456789\n")
    planted.chmod(0o600)
    os.chown(planted, 65534, 65534)  # nobody
    token, kept = local_token(planted)
    assert token != "chosen-by-somebody-else-0123456789"
    assert kept and planted.stat().st_uid == os.getuid()
