"""An image a provider would refuse never reaches it, so it cannot wedge its thread (D287).

Anthropic refuses a whole request for one image whose bytes are no image or not the type it
was declared as, and every later request of the thread carries that image again: users of
other agents report a conversation that cannot go on. Here a web upload goes through the
whole service to `FakeLLM`, which checks images as the provider does: a mislabelled photo is
sent as what its bytes are, a file that only claims to be an image is refused in the thread
on the way in, and the thread answers the next message too.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from gateway.channels import gateway_settings
from tests.support.fake_llm import FakeLLM
from tests.support.file_samples import image
from tests.support.service_rig import ServiceRig, serving

pytestmark = pytest.mark.usefixtures("model_requests")


@contextlib.asynccontextmanager
async def _running(
    tmp_path: Path, fake: FakeLLM, model: str = "anthropic:claude-test"
) -> AsyncIterator[ServiceRig]:
    openai = model.startswith("openai:")
    settings = gateway_settings(
        store_url=f"sqlite:///{tmp_path}/store.db",
        broker_url=f"sqlite:///{tmp_path}/broker.db",
        web_url=f"sqlite:///{tmp_path}/web.db",
        model=model,
        model_api_key=SecretStr("sk-test"),
        model_base_url=fake.openai_base_url if openai else fake.anthropic_base_url,
    )
    async with serving(settings) as rig:
        yield rig


def _file(name: str, data: bytes, media_type: str) -> dict[str, str]:
    return {"name": name, "media_type": media_type, "data": base64.b64encode(data).decode()}


def _images(body: object) -> list[dict[str, object]]:
    """The image blocks of an Anthropic request body."""
    assert isinstance(body, dict)
    return [
        block
        for message in body["messages"]
        if isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "image"
    ]


async def test_a_mislabelled_or_false_image_does_not_wedge_the_thread(tmp_path: Path) -> None:
    async with FakeLLM() as fake, _running(tmp_path, fake) as rig:
        jpeg = image("jpg")
        fake.reply("A blue and yellow snake logo.")
        body = {
            "text": "what are these?",
            "files": [
                _file("photo.png", jpeg, "image/png"),  # a JPEG its sender called a PNG
                _file("chart.png", b"<html>session expired</html>", "image/png"),
            ],
        }
        response = await rig.http.post("/web/uploads/t1", json=body)
        assert response.status_code == 202, response.text
        notice, answer = await rig.answers("t1", 2)
        assert notice["kind"] == "failure_notice"
        assert "chart.png: it is not a PNG, JPEG, GIF or WebP image" in notice["text"]
        assert answer["text"] == "A blue and yellow snake logo."
        [sent] = _images(fake.requests[0].body)
        assert sent["source"] == {
            "type": "base64",
            "media_type": "image/jpeg",
            "data": base64.b64encode(jpeg).decode(),
        }

        # the next message of the thread carries the photo again, and is answered
        fake.reply("Still the snake.")
        again = await rig.http.post("/web/threads/t1/messages", json={"text": "and now?"})
        assert again.status_code == 202, again.text
        *_, last = await rig.answers("t1", 3)
        assert last["text"] == "Still the snake."
        assert len(_images(fake.requests[1].body)) == 1
        assert fake.refused_images == 0
        fake.assert_drained()


async def test_an_image_the_model_cannot_take_is_withheld_not_wedging(tmp_path: Path) -> None:
    """A model without image input refuses every request carrying one (D289)."""
    async with FakeLLM() as fake, _running(tmp_path, fake, "openai:text-only") as rig:
        fake.vision = False
        fake.reply("I cannot see images here; what does the chart show?")
        body = {"text": "what is this?", "files": [_file("chart.png", image("png"), "image/png")]}
        response = await rig.http.post("/web/uploads/t1", json=body)
        assert response.status_code == 202, response.text
        [answer] = await rig.answers("t1", 1)
        assert answer["text"] == "I cannot see images here; what does the chart show?"
        refused, sent = fake.requests
        assert "image_url" in str(refused.body) and "image_url" not in str(sent.body)
        assert "It is not shown: the model provider refused a request" in str(sent.body)
        assert fake.refused_images == 1

        fake.reply("Revenue by region.")
        again = await rig.http.post("/web/threads/t1/messages", json={"text": "revenue"})
        assert again.status_code == 202, again.text
        *_, last = await rig.answers("t1", 2)
        assert last["text"] == "Revenue by region."
        assert len(fake.requests) == 3 and fake.refused_images == 1  # no refusal this time
        fake.assert_drained()


async def test_fake_llm_refuses_what_the_provider_refuses(tmp_path: Path) -> None:
    """The check above is only as good as the fake: it answers the provider's 400."""
    async with FakeLLM() as fake:
        png_bytes = base64.b64encode(image("png")).decode()
        jpeg_bytes = base64.b64encode(image("jpg")).decode()
        url = fake.anthropic_base_url.rstrip("/") + "/v1/messages"

        def request(media_type: str, data: str) -> dict[str, object]:
            source = {"type": "base64", "media_type": media_type, "data": data}
            return {
                "model": "claude-test",
                "max_tokens": 10,
                "messages": [{"role": "user", "content": [{"type": "image", "source": source}]}],
            }

        async with httpx.AsyncClient() as http:
            mismatch = await http.post(url, json=request("image/png", jpeg_bytes))
            garbage = await http.post(url, json=request("image/png", "aGVsbG8="))
            fake.reply("fine")
            fine = await http.post(url, json=request("image/png", png_bytes))
        assert mismatch.status_code == 400
        assert "appears to be a image/jpeg image" in mismatch.json()["error"]["message"]
        assert garbage.status_code == 400
        assert "Could not process image" in garbage.json()["error"]["message"]
        assert fine.status_code == 200
        assert fake.refused_images == 2
