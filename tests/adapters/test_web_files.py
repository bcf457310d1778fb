"""Web uploads reach the model: a message with files in base64, through the whole service.

``POST /web/uploads/{thread}`` takes a message with its files under a larger body limit than
the rest of the web channel; the files are held before the message is taken, and a refused
one is said in the thread with nothing of it held.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.channels import gateway_settings
from harness_core import ImagePart, TextPart, UserMessage
from tests.support import files_agent
from tests.support.file_samples import pdf, png
from tests.support.service_rig import ServiceRig, serving


@contextlib.asynccontextmanager
async def _running(tmp_path: Path, **extra: Any) -> AsyncIterator[ServiceRig]:
    settings = gateway_settings(
        store_url=f"sqlite:///{tmp_path}/store.db",
        broker_url=f"sqlite:///{tmp_path}/broker.db",
        web_url=f"sqlite:///{tmp_path}/web.db",
        plugin="tests.support.files_agent",
        **extra,
    )
    async with serving(settings) as rig:
        yield rig


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[ServiceRig]:
    async with _running(tmp_path) as running:
        yield running


def _file(name: str, data: bytes, media_type: str) -> dict[str, str]:
    return {"name": name, "media_type": media_type, "data": base64.b64encode(data).decode()}


async def test_an_upload_reaches_the_model_as_an_image_and_text(rig: ServiceRig) -> None:
    image = png(4, 4)
    body = {
        "text": "what is in these?",
        "client_message_id": "m-1",
        "files": [
            _file("screen.png", image, "image/png"),
            _file("config.json", b'{"retries": 3}', "application/json"),
            _file("spec.pdf", pdf(["The spec says ship on Friday"]), "application/pdf"),
        ],
    }
    response = await rig.http.post("/web/uploads/t1", json=body)
    assert response.status_code == 202, response.text
    [answer] = await rig.answers("t1", 1)
    parts = files_agent.newest_user_parts()
    assert isinstance(parts[0], TextPart) and "what is in these?" in parts[0].text
    assert parts[1] == TextPart(text="[file: screen.png]")
    assert isinstance(parts[2], ImagePart)
    assert base64.b64decode(parts[2].data) == image
    assert parts[3] == TextPart(text='[file: config.json]\n{"retries": 3}')
    assert isinstance(parts[4], TextPart)
    assert parts[4].text.startswith("[file: spec.pdf]\n--- page 1 ---\nThe spec says ship")
    assert "image: image/png" in answer["text"]
    # the thread shows what was sent: each file's name, type and size, none of its bytes
    items = (await rig.http.get("/web/threads/t1")).json()["items"]
    [message] = [item for item in items if item["kind"] == "message"]
    assert [(f["name"], f["media_type"], f["blob"]) for f in message["files"]] == [
        ("screen.png", "image/png", None),
        ("config.json", "application/json", None),
        ("spec.pdf", "application/pdf", None),
    ]
    assert message["files"][0]["size"] == len(image)
    # the same post again (a client's retry) is taken once
    again = await rig.http.post("/web/uploads/t1", json=body)
    assert again.status_code == 202 and again.json()["duplicate"] is True
    # the same id with other files is another message: told, not reported a duplicate
    other = {**body, "files": [_file("other.txt", b"another file", "text/plain")]}
    taken = await rig.http.post("/web/uploads/t1", json=other)
    assert taken.status_code == 409, taken.text
    assert taken.json()["error"]["code"] == "message_id_taken"
    # so is the same id with other bytes of the same name, type and size (was a duplicate)
    files = [
        _file("screen.png", image, "image/png"),
        _file("config.json", b'{"retries": 4}', "application/json"),
        _file("spec.pdf", pdf(["The spec says ship on Friday"]), "application/pdf"),
    ]
    other = {**body, "files": files}
    taken = await rig.http.post("/web/uploads/t1", json=other)
    assert taken.status_code == 409, taken.text
    assert taken.json()["error"]["code"] == "message_id_taken"
    digest = hashlib.sha256(b'{"retries": 3}').hexdigest()
    assert message["files"][1]["ref"] == f"sha256:{digest}"  # what tells them apart


async def test_a_file_name_shows_no_invisible_or_direction_changing_character(
    rig: ServiceRig,
) -> None:
    """``invoice\\u202efdp.exe`` read as ``invoiceexe.pdf`` in the thread, in notices and to
    the agent (an outside probe)."""
    body = {
        "text": "see",
        "files": [_file("invoice\u202efdp.exe.txt", b"hello", "text/plain")],
    }
    response = await rig.http.post("/web/uploads/t9", json=body)
    assert response.status_code == 202, response.text
    await rig.answers("t9", 1)
    items = (await rig.http.get("/web/threads/t9")).json()["items"]
    [message] = [item for item in items if item["kind"] == "message"]
    assert [f["name"] for f in message["files"]] == ["invoicefdp.exe.txt"]
    assert files_agent.newest_user_parts()[1] == TextPart(text="[file: invoicefdp.exe.txt]\nhello")


async def test_files_alone_are_a_message_and_nothing_at_all_is_not(rig: ServiceRig) -> None:
    """An upload of files and no `text` was refused: "'text' is required" (an outside probe)."""
    body = {"files": [_file("notes.txt", b"ship on Friday", "text/plain")]}
    response = await rig.http.post("/web/uploads/t4", json=body)
    assert response.status_code == 202, response.text
    await rig.answers("t4", 1)
    assert files_agent.newest_user_parts()[-1] == TextPart(text="[file: notes.txt]\nship on Friday")
    empty = await rig.http.post("/web/uploads/t4", json={"files": []})
    assert empty.status_code == 400 and empty.json()["error"]["code"] == "empty_text"


async def test_binary_bytes_sent_as_text_are_named_not_read(rig: ServiceRig) -> None:
    """A binary file declared text/plain reached the model as garbled text (tokens spent)."""
    body = {
        "text": "what is this?",
        "files": [
            _file("dump.txt", bytes(range(256)) * 8, "text/plain"),
            _file("notes.txt", "caf\u00e9 \u2014 ok\n".encode(), "text/plain"),
        ],
    }
    response = await rig.http.post("/web/uploads/t3", json=body)
    assert response.status_code == 202, response.text
    await rig.answers("t3", 1)
    [_, binary, text] = files_agent.newest_user_parts()
    assert binary == TextPart(text="[file: dump.txt]\n[this file was not read: it is not text]")
    assert text == TextPart(text="[file: notes.txt]\ncaf\u00e9 \u2014 ok\n")


async def test_a_large_upload_is_refused_on_the_message_route_but_not_on_the_upload_one(
    rig: ServiceRig,
) -> None:
    text = "x" * 300_000  # a text file over the web channel's 256 KiB body limit, once encoded
    body = json.dumps(
        {"text": "a big log", "files": [_file("big.log", text.encode(), "text/plain")]}
    )
    headers = {"content-type": "application/json"}
    refused = await rig.http.post("/web/threads/t2/messages", content=body, headers=headers)
    assert refused.status_code == 413
    taken = await rig.http.post("/web/uploads/t2", content=body, headers=headers)
    assert taken.status_code == 202, taken.text
    await rig.answers("t2", 1)
    [_, part] = files_agent.newest_user_parts()
    assert isinstance(part, TextPart)
    assert part.text.endswith("[cut: the first 100,000 of 300,000 characters are shown]")


async def test_oversize_and_unknown_uploads_are_refused_in_the_thread_and_not_held(
    tmp_path: Path,
) -> None:
    async with _running(tmp_path, file_max_mb=0.001) as rig:
        body = {
            "text": "two files",
            "client_message_id": "m-2",
            "files": [
                _file("big.csv", b"a,b\n" * 500, "text/csv"),
                _file("disk.img", b"\0" * 10, "application/x-raw-disk-image"),
            ],
        }
        response = await rig.http.post("/web/uploads/t3", json=body)
        assert response.status_code == 202, response.text
        notice, answer = await rig.answers("t3", 2)
        assert notice["kind"] == "failure_notice"
        assert "big.csv: it is 2.0 KB, over the 1.0 KB limit for one file" in notice["text"]
        assert "disk.img: I do not read application/x-raw-disk-image files" in notice["text"]
        assert answer["text"].startswith("text: two files")
        [part] = files_agent.newest_user_parts()
        assert "not read" in part.text  # type: ignore[union-attr]
        for number in range(2):
            assert (
                await rig.broker.blobs.find(response.json()["session"], f"web:m-2:{number}") is None
            )


async def test_bad_base64_is_refused_with_one_clear_error(rig: ServiceRig) -> None:
    body = {"text": "hi", "files": [{"name": "a.txt", "data": "not base64!"}]}
    response = await rig.http.post("/web/uploads/t4", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "files[0].data is not valid base64"


async def test_base64_wrapped_as_the_base64_command_prints_it_is_taken(rig: ServiceRig) -> None:
    """`base64` writes a line end every 76 characters: such a file was refused (a probe)."""
    content = b"a line of a log file\n" * 20
    wrapped = base64.encodebytes(content).decode()  # 76 characters a line, as `base64` prints
    assert "\n" in wrapped.strip()
    body = {"text": "hi", "files": [{"name": "log.txt", "data": wrapped.replace("\n", "\r\n")}]}
    response = await rig.http.post("/web/uploads/t5", json=body)
    assert response.status_code == 202, response.text
    [message] = (await rig.http.get("/web/threads/t5")).json()["items"][:1]
    assert [(f["name"], f["size"]) for f in message["files"]] == [("log.txt", len(content))]


@pytest.mark.parametrize(
    ("file", "said"),
    [
        (
            {"name": "a.txt", "media_type": "\u0000\n;;", "data": "eA=="},
            "files[0].media_type is not a media type (type/subtype, printable ASCII)",
        ),
        (
            {"name": "a.txt", "media_type": "text", "data": "eA=="},
            "files[0].media_type is not a media type (type/subtype, printable ASCII)",
        ),
        (
            {"name": "a\nb.txt", "media_type": "text/plain", "data": "eA=="},
            "files[0].name must not contain control characters",
        ),
    ],
)
async def test_a_file_whose_name_or_type_would_garble_the_thread_is_refused(
    rig: ServiceRig, file: dict[str, str], said: str
) -> None:
    # both are shown in the thread (a refusal names the type): one clear 400, nothing taken
    response = await rig.http.post("/web/uploads/t9", json={"text": "x", "files": [file]})
    assert response.status_code == 400
    assert response.json()["error"] == {"code": "invalid_request", "message": said}
    items = (await rig.http.get("/web/threads/t9")).json()["items"]
    assert [i["kind"] for i in items] == []
    fine = {"name": "a.txt", "media_type": "text/plain; charset=utf-8", "data": "eA=="}
    taken = await rig.http.post("/web/uploads/t9", json={"text": "x", "files": [fine]})
    assert taken.status_code == 202, taken.text


async def test_a_message_whose_files_take_longer_than_the_lease_keeps_its_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The ticket was renewed only between messages: a PDF read past the lease let it lapse,
    and every other slot of the same process took the session in turn, superseding the
    first's lease and reading the file again (an outside probe: four reads at once)."""
    reads = 0

    async def slow(data: bytes, max_pages: int, max_chars: int) -> str:
        nonlocal reads
        reads += 1
        await asyncio.sleep(5)  # past the 3 s lease (and ticket)
        return "--- page 1 ---\nread slowly"

    monkeypatch.setattr("gateway.files.read_pdf", slow)
    caplog.set_level(logging.INFO, logger="gateway.worker")
    async with _running(tmp_path, lease_seconds=3, renew_seconds=0.5, linger_seconds=0) as rig:
        body = {"text": "read it", "files": [_file("spec.pdf", pdf(["x"]), "application/pdf")]}
        response = await rig.http.post("/web/uploads/t1", json=body)
        assert response.status_code == 202, response.text
        [answer] = await rig.answers("t1", 1)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # no lease lost
    taken = [r for r in caplog.records if r.getMessage() == "session taken"]
    assert (len(taken), reads) == (1, 1)
    assert answer["kind"] == "reply"
    assert files_agent.newest_user_parts()[1] == TextPart(
        text="[file: spec.pdf]\n--- page 1 ---\nread slowly"
    )


async def test_a_slow_pdf_holds_up_its_own_thread_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message's PDFs were read in the session's loop: one post of ten slow PDFs held every
    other thread of its space for two minutes (an outside probe). They are read apart now:
    another thread is answered meanwhile, and the thread's own next message waits its turn."""
    started, release = asyncio.Event(), asyncio.Event()

    async def slow(data: bytes, max_pages: int, max_chars: int) -> str:
        started.set()
        await release.wait()
        return "--- page 1 ---\nread at last"

    monkeypatch.setattr("gateway.files.read_pdf", slow)
    before = len(files_agent.requests())
    async with _running(tmp_path) as rig:
        body = {"text": "read it", "files": [_file("spec.pdf", pdf(["x"]), "application/pdf")]}
        assert (await rig.http.post("/web/uploads/t1", json=body)).status_code == 202
        await asyncio.wait_for(started.wait(), 15)
        then = await rig.http.post("/web/threads/t1/messages", json={"text": "and then?"})
        assert then.status_code == 202
        other = await rig.http.post("/web/threads/t2/messages", json={"text": "hello"})
        assert other.status_code == 202
        [answer] = await rig.answers("t2", 1)  # while the PDF is still being read
        assert answer["text"] == "text: hello"
        items = (await rig.http.get("/web/threads/t1")).json()["items"]
        assert [i["kind"] for i in items] == ["message", "message"]  # "and then?" waits too
        release.set()
        found = await rig.answers("t1", 1)
    first = [
        [part.text for part in m.content if isinstance(part, TextPart)]
        for r in files_agent.requests()[before:]
        for m in r.messages
        if isinstance(m, UserMessage)
    ]
    t1 = [texts for texts in first if texts and texts[0].startswith(("read it", "and then?"))]
    assert t1[0][0].startswith("read it")  # the lane took the PDF's message first
    assert "[file: spec.pdf]\n--- page 1 ---\nread at last" in t1[0]
    assert found[0]["kind"] == "reply"
