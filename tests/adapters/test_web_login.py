"""The web channel's tokens (D380): every page and request needs one; a browser signs in once."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI

from adapters.web import MemoryMailbox, WebChannel, WebLimits
from adapters.web.login import COOKIE, WebLogin
from adapters.web.settings import WebSettings
from config import SettingsError
from gateway.channels import gateway_settings
from harness_core import SequentialIds
from harness_core.testing import ManualClock
from tests.adapters.kit import TestSink

ALICE = "alice-secret-0123456789abcdef"
BOB = "bob-secret-0123456789abcdefgh"
URL = "/web/threads/t1/messages"


@pytest.fixture
async def guarded(clock: ManualClock, sink: TestSink) -> AsyncIterator[httpx.AsyncClient]:
    web = WebChannel(
        MemoryMailbox(),
        clock=clock,
        ids=SequentialIds("id-"),
        limits=WebLimits(keepalive_s=0.2),
        login=WebLogin(WebSettings(tokens=(f"alice:{ALICE}", f"bob:{BOB}")).logins()),
    )
    await web.start(sink)
    app = FastAPI()
    app.include_router(web.router)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://web.test") as http:
        yield http
    await web.close()


def _bearer(secret: str) -> dict[str, str]:
    return {"authorization": f"Bearer {secret}"}


async def test_without_a_token_nothing_is_read_or_taken(
    guarded: httpx.AsyncClient, sink: TestSink
) -> None:
    for method, path in [
        ("POST", URL),
        ("POST", "/web/uploads/t1"),
        ("POST", "/web/threads/t1/decisions"),
        ("GET", "/web/threads/t1"),
        ("GET", "/web/threads"),
        ("GET", "/web/threads/t1/events"),
        ("GET", "/web/files/sha256:" + "0" * 64),
    ]:
        for headers in ({}, _bearer("wrong-0123456789abcdefghij"), {"cookie": f"{COOKIE}=x"}):
            response = await guarded.request(method, path, json={"text": "hi"}, headers=headers)
            assert response.status_code == 401, (method, path, response.text)
            assert response.json()["error"]["code"] == "unauthorized"
            assert response.headers["www-authenticate"].startswith("Bearer")
    assert sink.inbound == []
    # a page sends the browser to the sign-in, and back after it
    page = await guarded.get("/web/threads/t1/page?space=desk")
    assert page.status_code == 303
    assert page.headers["location"] == "/web/login?next=%2Fweb%2Fthreads%2Ft1%2Fpage%3Fspace%3Ddesk"
    assert (await guarded.get("/web/")).headers["location"] == "/web/login?next=%2Fweb%2F"
    form = await guarded.get("/web/login?next=/web/threads/t1/page")
    assert form.status_code == 200 and 'name="token"' in form.text
    assert 'value="/web/threads/t1/page"' in form.text


async def test_a_bearer_token_writes_by_its_name(
    guarded: httpx.AsyncClient, sink: TestSink
) -> None:
    response = await guarded.post(URL, json={"text": "hello"}, headers=_bearer(ALICE))
    assert response.status_code == 202, response.text
    same = await guarded.post(URL, json={"text": "hi", "author": "alice"}, headers=_bearer(ALICE))
    assert same.status_code == 202
    # another name than the token's is refused, not silently replaced
    posing = await guarded.post(URL, json={"text": "hi", "author": "bob"}, headers=_bearer(ALICE))
    assert posing.status_code == 400 and "signed in as 'alice'" in posing.text
    assert [(i.author.id, i.author.name) for i in sink.inbound] == [("alice", "alice")] * 2
    thread = (await guarded.get("/web/threads/t1", headers=_bearer(BOB))).json()["items"]
    assert [item["author"]["id"] for item in thread] == ["alice", "alice"]


async def test_a_browser_signs_in_once_and_out(
    guarded: httpx.AsyncClient, sink: TestSink, caplog: pytest.LogCaptureFixture
) -> None:
    form = {"token": "not-it", "next": "/web/threads/t1/page"}
    with caplog.at_level(logging.INFO, logger="adapters.web.channel"):
        refused = await guarded.post("/web/login", data=form)
    assert refused.status_code == 401 and "not known here" in refused.text
    assert COOKIE not in refused.headers.get("set-cookie", "")
    signed = await guarded.post("/web/login", data={**form, "token": BOB})
    assert signed.status_code == 303 and signed.headers["location"] == "/web/threads/t1/page"
    cookie = signed.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}=") and BOB not in cookie  # an HMAC, not the secret
    for flag in ("HttpOnly", "SameSite=Strict", "Path=/web", "Max-Age="):
        assert flag in cookie
    assert "Secure" not in cookie  # plain http here; https adds it
    assert BOB not in caplog.text and "not-it" not in caplog.text
    # the client keeps the cookie: pages and posts work, by the token's name
    page = await guarded.get("/web/threads/t1/page")
    assert page.status_code == 200 and "signed in as <b>bob</b>" in page.text
    assert 'aria-label="your name" hidden' in page.text
    posted = await guarded.post(URL, json={"text": "from the page"})
    assert posted.status_code == 202 and sink.inbound[-1].author.id == "bob"
    # signing out forgets it
    out = await guarded.post("/web/logout")
    assert out.status_code == 303 and "Max-Age=0" in out.headers["set-cookie"]
    guarded.cookies.clear()
    assert (await guarded.post(URL, json={"text": "again"})).status_code == 401


@pytest.mark.parametrize(
    "after",
    ["https://evil.example/", "//evil.example/web/", "/elsewhere", "/web/\\\\evil", ""],
)
async def test_a_sign_in_goes_back_to_this_channel_only(
    guarded: httpx.AsyncClient, after: str
) -> None:
    signed = await guarded.post("/web/login", data={"token": ALICE, "next": after})
    assert signed.status_code == 303 and signed.headers["location"] == "/web/"


@pytest.mark.parametrize(
    ("body", "headers", "status"),
    [
        ("a=1&" * 500, {}, 400),  # more fields than a sign-in has: was a 500
        ("x" * 5000, {}, 413),
        (f"token={ALICE}", {"content-length": ""}, 413),
        ("token=caf%C3%A9-0123456789abcdefghijk", {}, 401),
        ("token=%00%ff&next=%0d%0aSet-Cookie:x", {}, 401),
    ],
)
async def test_a_hostile_sign_in_is_one_clear_answer(
    guarded: httpx.AsyncClient, body: str, headers: dict[str, str], status: int
) -> None:
    response = await guarded.post(
        "/web/login",
        content=body.encode(),
        headers={"content-type": "application/x-www-form-urlencoded", **headers},
    )
    assert response.status_code == status, response.text
    assert "set-cookie" not in response.headers


async def test_a_sign_in_from_another_site_is_refused(guarded: httpx.AsyncClient) -> None:
    response = await guarded.post(
        "/web/login", data={"token": ALICE}, headers={"sec-fetch-site": "cross-site"}
    )
    assert response.status_code == 403 and "set-cookie" not in response.headers
    # nor a sign-out: another site's page signed a person out with a form post (a probe)
    out = await guarded.post("/web/logout", headers={"sec-fetch-site": "cross-site"})
    assert out.status_code == 403 and "set-cookie" not in out.headers


async def test_a_signed_in_decision_is_vouched_for(
    guarded: httpx.AsyncClient, sink: TestSink
) -> None:
    """Profiles may name web approvers once the channel can tell who decides (D297, D380)."""
    body = {
        "run_id": "run-1",
        "wait_id": "wait-1",
        "decisions": [{"tool_call_id": "c1", "args_digest": "d", "approved": True}],
    }
    response = await guarded.post("/web/threads/t1/decisions", json=body, headers=_bearer(ALICE))
    assert response.status_code == 202, response.text
    [decision] = sink.decisions
    assert decision.identified and decision.decided_by.id == "alice"


async def test_without_tokens_the_channel_is_open_as_before(
    client: httpx.AsyncClient, sink: TestSink
) -> None:
    assert (await client.post(URL, json={"text": "hi", "author": "ann"})).status_code == 202
    assert (await client.get("/web/threads/t1/page")).status_code == 200
    # nothing to sign in to: the sign-in form goes back
    login = await client.get("/web/login?next=/web/threads/t1/page")
    assert login.status_code == 303 and login.headers["location"] == "/web/threads/t1/page"
    assert sink.inbound[0].author.id == "ann"


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("alice", "expected name:secret"),
        ("Alice:" + ALICE, "the name must be 1-64"),
        ("alice:short", "the secret must be 24+"),
        (f"alice:{ALICE},bob:{ALICE}", "names and secrets must be unique"),
        (",", "names no token"),
    ],
)
def test_a_bad_token_setting_is_one_line_never_showing_the_secret(value: str, said: str) -> None:
    with pytest.raises(SettingsError) as raised:
        gateway_settings(web_tokens=value)
    assert said in str(raised.value) and ALICE not in str(raised.value)
    assert str(raised.value).count("\n") == 0


def test_the_secrets_are_hidden_from_logs_and_the_start_lines_name_none() -> None:
    from adapters.kit import ChannelContext
    from adapters.web.spec import SPEC
    from harness_core import SystemClock

    section = WebSettings(tokens=(f"alice:{ALICE}",))
    assert {f"alice:{ALICE}", ALICE} <= set(SPEC.secrets(section))
    context = ChannelContext(clock=SystemClock(), call_timeout_s=10.0)
    lines = "\n".join(SPEC.describe(section, context))
    assert "sign in" in lines and "Bearer <your web token>" in lines and ALICE not in lines


async def test_behind_an_https_proxy_the_cookie_is_secure(sink: TestSink) -> None:
    """The proxy speaks plain HTTP to the gateway: `public_url` says what the browser uses."""
    web = WebChannel(
        MemoryMailbox(),
        login=WebLogin({ALICE: "alice"}),
        secure_cookie=True,
    )
    await web.start(sink)
    app = FastAPI()
    app.include_router(web.router)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://web.test") as http:
        signed = await http.post("/web/login", data={"token": ALICE})
    await web.close()
    assert signed.status_code == 303 and "; Secure" in signed.headers["set-cookie"]
