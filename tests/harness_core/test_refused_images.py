"""A request the provider refuses for an image does not wedge the lane (D289).

Every request of a lane carries the images of its window again, so one image the provider
will not take (over Anthropic's 2,000 pixels in a request of more than 20 images, any image
for a model without image input) would fail that request and every later one: users of other
agents report conversations that cannot go on. Here the request goes once more with the
window's images replaced by a note saying why, the lane answers, and its later requests send
the note from the start; an image sent afterwards goes as usual. A refusal the images did not
cause fails the run as before, and the images go again. The real pydantic-ai client talks HTTP
to `FakeLLM`, which refuses images in the providers' own words.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic_ai.models import Model

from harness_core import texts
from harness_core.events import RetryScheduled
from harness_core.messages import (
    AssistantMessage,
    ImagePart,
    TextPart,
    UserMessage,
    message_text,
)
from harness_core.models import ModelRef, ModelRequest
from harness_core.models.pydantic_ai import PydanticAIModel
from harness_core.result import Ok
from harness_core.session.types import RecordQuery
from tests.support.fake_llm import (
    FakeLLM,
    anthropic_model,
    openai_chat_model,
)
from tests.support.file_samples import image, png
from tests.support.harness_kit import Kit, make_kit

NOTE = "It is not shown: the model provider refused a request that carried it."


pytestmark = pytest.mark.usefixtures("model_requests")


async def _talking_to(kit: Kit, fake: FakeLLM, provider: str) -> Kit:
    builders: dict[str, Callable[[FakeLLM], Model]] = {
        "anthropic": anthropic_model,
        "openai": openai_chat_model,
    }
    kit.harness._rt.model = PydanticAIModel(lambda ref: builders[ref.provider](fake))
    await kit.harness.set_model(ModelRef(provider=provider, model_id="m"))
    return kit


def _image(data: bytes) -> ImagePart:
    return ImagePart(media_type="image/png", data=base64.b64encode(data).decode())


def _message(text: str, *images: bytes) -> UserMessage:
    return UserMessage(content=(TextPart(text=text), *(_image(data) for data in images)))


def _images(body: Any) -> int:
    """The image blocks a request body carries (Anthropic ``image``, chat ``image_url``)."""
    if isinstance(body, dict):
        own = body.get("type") in ("image", "image_url")
        return own + sum(_images(value) for value in body.values())
    if isinstance(body, list):
        return sum(_images(value) for value in body)
    return 0


def _notes(body: Any) -> int:
    return json.dumps(body).count(NOTE)


async def _answered(kit: Kit, prompt: str | UserMessage) -> str:
    outcome = await kit.harness.prompt(prompt)
    assert isinstance(outcome, Ok) and outcome.value.kind == "completed", outcome
    final = outcome.value.final_message
    assert final is not None
    return message_text(final)


async def test_a_refused_image_is_withheld_and_the_lane_goes_on(
    tmp_path: Path, fake: FakeLLM
) -> None:
    kit = await _talking_to(await make_kit("memory", tmp_path), fake, "anthropic")
    retries: list[RetryScheduled] = []
    kit.harness.events.on("retry_scheduled", retries.append)
    # 21 screenshots, one of them 2,100 pixels wide: Anthropic refuses the request
    shots = [png(), *(png(4, 4) for _ in range(19)), png(2100, 2)]
    fake.reply("Twenty-one screenshots; I cannot see them.")
    assert await _answered(kit, _message("what changed?", *shots)) == (
        "Twenty-one screenshots; I cannot see them."
    )
    refused, sent = fake.requests
    assert refused.answered_with is None and fake.refused_images == 1
    assert _images(refused.body) == 21
    assert (_images(sent.body), _notes(sent.body)) == (0, 21)
    assert "(image/png, 73 bytes)" in json.dumps(sent.body)
    [retry] = retries
    assert retry.delay_ms == 0 and retry.error_kind == "invalid_request"
    assert "without the conversation's images" in retry.error_message
    assert "exceed max allowed size for many-image requests" in retry.error_message
    # both attempts are durable and counted, the refused one's usage recorded as an error
    usage = await kit.storage.find_records(RecordQuery(type="usage"))
    attempts = sorted((u.record.attempt, u.record.stop_reason) for u in usage)  # type: ignore[union-attr]
    assert attempts == [(1, "error"), (2, "stop")]

    # the next request sends the notes from the start: no refusal, one request
    fake.reply("Yes.")
    assert await _answered(kit, "still there?") == "Yes."
    assert len(fake.requests) == 3 and fake.refused_images == 1
    assert (_images(fake.requests[2].body), _notes(fake.requests[2].body)) == (0, 21)

    # an image sent afterwards goes as usual, beside the notes
    fake.reply("A small red square.")
    assert await _answered(kit, _message("and this one?", png())) == "A small red square."
    assert (_images(fake.requests[3].body), _notes(fake.requests[3].body)) == (1, 21)
    fake.assert_drained()

    # a restarted process learns it again: one refused request, then the same answer
    reopened = await _talking_to(await kit.reopen(), fake, "anthropic")
    fake.reply("Back.")
    assert await _answered(reopened, "after the restart?") == "Back."
    assert fake.refused_images == 2
    assert (_images(fake.requests[-1].body), _notes(fake.requests[-1].body)) == (0, 22)


class _Estimates(PydanticAIModel):
    """The real client, keeping each request's size estimate."""

    estimates: list[int | None]

    async def request(
        self,
        request: ModelRequest,
        on_update: Callable[[AssistantMessage], None] | None = None,
    ) -> AssistantMessage:
        self.estimates.append(request.estimated_input_tokens)
        return await super().request(request, on_update)


async def test_a_model_without_image_input_answers_with_a_note(
    tmp_path: Path, fake: FakeLLM
) -> None:
    kit = await _talking_to(await make_kit("memory", tmp_path), fake, "openai")
    client = _Estimates(lambda ref: openai_chat_model(fake))
    client.estimates = []
    kit.harness._rt.model = client
    fake.vision = False
    fake.reply("I cannot see images, but the note says you sent one.")
    answer = await _answered(kit, _message("what is this?", image("png")))
    assert answer == "I cannot see images, but the note says you sent one."
    refused, sent = fake.requests
    assert _images(refused.body) == 1 and fake.refused_images == 1
    assert (_images(sent.body), _notes(sent.body)) == (0, 1)
    fake.reply("Hello.")
    assert await _answered(kit, "hello") == "Hello."
    assert len(fake.requests) == 3 and fake.refused_images == 1
    # the image counted while it was sent (a 16 x 16 icon: 1 token), the note once it is not
    sent_image, sent_note, later = client.estimates
    assert sent_image is not None and sent_note is not None and later is not None
    note = len(texts.image_withheld("image/png", len(image("png")))) // 4
    assert sent_note - sent_image == pytest.approx(note, abs=2)


async def test_a_refusal_the_images_did_not_cause_fails_and_keeps_them(
    tmp_path: Path, fake: FakeLLM
) -> None:
    kit = await _talking_to(await make_kit("memory", tmp_path), fake, "anthropic")
    fake.reply("A red square.")
    assert await _answered(kit, _message("look", png())) == "A red square."
    # the provider refuses the next request for another reason, with the images withheld too
    fake.fail(400, "messages: text content blocks must be non-empty")
    fake.fail(400, "messages: text content blocks must be non-empty")
    outcome = await kit.harness.prompt("and now?")
    assert isinstance(outcome, Ok) and outcome.value.kind == "failed"
    first, second = fake.requests[1:]
    assert (_images(first.body), _images(second.body), _notes(second.body)) == (1, 0, 1)
    # the image was not why: the next request carries it again
    fake.reply("Still red.")
    assert await _answered(kit, "again?") == "Still red."
    assert (_images(fake.requests[-1].body), _notes(fake.requests[-1].body)) == (1, 0)


async def test_a_refused_request_without_images_is_not_sent_again(
    tmp_path: Path, fake: FakeLLM
) -> None:
    kit = await _talking_to(await make_kit("memory", tmp_path), fake, "anthropic")
    fake.fail(400, "messages: text content blocks must be non-empty")
    outcome = await kit.harness.prompt("hello")
    assert isinstance(outcome, Ok) and outcome.value.kind == "failed"
    assert outcome.value.error is not None and "non-empty" in outcome.value.error.message
    assert len(fake.requests) == 1


async def test_the_fake_refuses_what_the_providers_refuse(fake: FakeLLM) -> None:
    """The tests above are only as good as the fake: these are the providers' 400s."""

    def block(data: bytes) -> dict[str, object]:
        encoded = base64.b64encode(data).decode()
        return {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": encoded},
        }

    def anthropic(*images: bytes) -> dict[str, object]:
        content = [block(data) for data in images]
        return {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": content}]}

    url = fake.anthropic_base_url.rstrip("/") + "/v1/messages"
    chat = fake.openai_base_url.rstrip("/") + "/chat/completions"
    data_url = "data:image/png;base64," + base64.b64encode(png()).decode()
    chat_body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url}}]}
        ],
    }
    async with httpx.AsyncClient() as http:
        many = await http.post(url, json=anthropic(*[png()] * 20, png(2001, 1)))
        fake.reply("fine")
        twenty = await http.post(url, json=anthropic(*[png()] * 19, png(2001, 1)))
        fake.vision = False
        blind = await http.post(chat, json=chat_body)
    assert many.status_code == 400
    assert many.json()["error"]["message"] == (
        "messages.0.content.20.image.source.base64.data: At least one of the image dimensions "
        "exceed max allowed size for many-image requests: 2000 pixels"
    )
    assert twenty.status_code == 200  # 20 images may be larger
    assert blind.status_code == 400
    assert blind.json()["error"]["message"] == (
        "Invalid content type. image_url is only supported by certain models."
    )
    assert fake.refused_images == 2
