"""An image counts toward a lane's size by its pixels, so a thread of screenshots compacts in time.

The estimate was text only: an image counted as nothing, so a lane of screenshots looked small
until the provider refused its request as too long. Now an image counts what Anthropic's
published rule says it costs (scaled to fit 1,568 pixels a side and about 1.15 megapixels, then
width x height / 750 tokens), read from its header; one whose size cannot be read counts as the
most an image can cost.
"""

from __future__ import annotations

import base64
import struct
from pathlib import Path

import pytest

from harness_core._runtime.context import (
    IMAGE_MAX_TOKENS,
    ContextWindow,
    estimate_tokens,
    image_tokens,
)
from harness_core.messages import (
    AgentMessage,
    ImagePart,
    TextPart,
    ToolResultMessage,
    UserMessage,
    message_text,
)
from harness_core.models import ModelInfo
from harness_core.models.scripted import text
from harness_core.options import CompactionSettings
from harness_core.result import Ok
from harness_core.session.entries import CompactionEntry
from harness_core.session.types import StoredEntry
from tests.support.file_samples import image, png
from tests.support.harness_kit import make_kit


def _part(data: bytes, media_type: str = "image/png") -> ImagePart:
    return ImagePart(media_type=media_type, data=base64.b64encode(data).decode())


@pytest.mark.parametrize(
    ("width", "height", "tokens"),
    [
        (200, 200, 53),  # Anthropic's table: about 54
        (1000, 1000, 1333),  # about 1,334
        (1092, 1092, 1590),  # about 1,590: the largest an image is sent at
        (4000, 3000, 1590),  # scaled down to fit first
        (8000, 200, 82),  # 1,568 x 39 after scaling
        (1, 1, 1),
    ],
)
def test_an_image_costs_its_pixels(width: int, height: int, tokens: int) -> None:
    assert image_tokens(_part(png(width, height))) == tokens


@pytest.mark.parametrize("extension", ["png", "jpg", "gif", "webp"])
def test_every_format_is_read_from_its_header(extension: str) -> None:
    # the real 16 x 16 sample files: 256 pixels
    assert image_tokens(_part(image(extension), f"image/{extension}")) == 1


def test_an_image_whose_size_cannot_be_read_counts_as_the_most() -> None:
    assert image_tokens(_part(b"not an image at all")) == IMAGE_MAX_TOKENS
    assert image_tokens(ImagePart(media_type="image/png", data="")) == IMAGE_MAX_TOKENS
    assert image_tokens(ImagePart(media_type="image/png", data="@@@@ not base64")) == (
        IMAGE_MAX_TOKENS
    )
    # a JPEG whose frame header lies behind 130 KB of metadata: not decoded to find it
    jpeg = image("jpg")
    metadata = b"".join(b"\xff\xe2" + struct.pack(">H", 65_000) + bytes(64_998) for _ in range(2))
    assert image_tokens(_part(jpeg[:2] + metadata + jpeg[2:], "image/jpeg")) == IMAGE_MAX_TOKENS


def test_the_window_counts_images_like_the_whole_list() -> None:
    shot = _part(png(1092, 1092))
    words = TextPart(text="what changed on this page?")
    messages: list[AgentMessage] = [
        UserMessage(content=(words, shot)),
        ToolResultMessage(tool_call_id="c", tool_name="screenshot", content=(shot,)),
    ]
    window = ContextWindow()
    for message in messages:
        window.add_message(message)
    assert window.tokens() == estimate_tokens(messages)
    text_only = estimate_tokens([UserMessage(content=(words,))])
    assert estimate_tokens(messages[:1]) == text_only + 1590


async def test_a_thread_of_screenshots_compacts_before_it_overflows(tmp_path: Path) -> None:
    kit = await make_kit(
        "memory",
        tmp_path,
        [text("first answer"), text("the summary"), text("three screenshots, all red")],
        compaction=CompactionSettings(reserve_tokens=1_000, keep_recent_tokens=100),
    )
    kit.model.info = ModelInfo(context_window=5_000, max_output_tokens=500)
    first = await kit.harness.prompt("hello")
    assert isinstance(first, Ok) and first.value.kind == "completed"
    shots = tuple(_part(png(1092, 1092)) for _ in range(3))
    # three screenshots are some 4,770 tokens: over 5,000 less the 1,000 kept free
    outcome = await kit.harness.prompt(
        UserMessage(content=(TextPart(text="what changed?"), *shots))
    )
    assert isinstance(outcome, Ok) and outcome.value.final_message is not None
    assert message_text(outcome.value.final_message) == "three screenshots, all red"
    log = await kit.storage.get_log()
    assert any(isinstance(i, StoredEntry) and isinstance(i.entry, CompactionEntry) for i in log)
    request = kit.model.requests[-1]
    assert message_text(request.messages[0]).startswith("Summary of the earlier conversation")
    assert (request.estimated_input_tokens or 0) > 3 * 1590
