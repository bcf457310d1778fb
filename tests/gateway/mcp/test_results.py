"""CallToolResult -> ToolOutput: every kind of content, isError, the bound, malformed results."""

from __future__ import annotations

import base64

from mcp_types import (
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
)

from gateway.mcp.results import MAX_IMAGES, to_output
from harness_core.messages import ImagePart, TextPart
from tests.support.file_samples import image, png

PNG = base64.b64encode(png()).decode()


def _out(result: object, max_chars: int = 1000):
    return to_output(result, server="s", tool="t", max_chars=max_chars)


def _texts(output) -> list[str]:
    return [part.text for part in output.content if isinstance(part, TextPart)]


def test_text_and_images_are_kept_in_order() -> None:
    output = _out(
        CallToolResult(
            content=[
                TextContent(text="one"),
                ImageContent(data=PNG, mime_type="image/png"),
                TextContent(text="two"),
            ]
        )
    )
    assert output.content == (
        TextPart(text="one"),
        ImagePart(media_type="image/png", data=PNG),
        TextPart(text="two"),
    )
    assert output.is_error is False


def test_structured_content_is_json_text_only_without_text() -> None:
    alone = _out(CallToolResult(content=[], structured_content={"n": 1, "ok": True}))
    assert _texts(alone) == ['{"n":1,"ok":true}']
    both = _out(CallToolResult(content=[TextContent(text="n is 1")], structured_content={"n": 1}))
    assert _texts(both) == ["n is 1"]


def test_resources_are_named_and_their_text_shown() -> None:
    output = _out(
        CallToolResult(
            content=[
                ResourceLink(name="readme", uri="file:///r.md", description="the readme"),
                EmbeddedResource(
                    resource=TextResourceContents(
                        uri="mem://a", text="body", mime_type="text/plain"
                    )
                ),
                EmbeddedResource(
                    resource=BlobResourceContents(
                        uri="mem://b", blob="AAAA", mime_type="application/zip"
                    )
                ),
                AudioContent(data="AAAA", mime_type="audio/wav"),
                ImageContent(data="AAAA", mime_type="image/tiff"),
            ]
        )
    )
    texts = _texts(output)
    assert texts[0] == "[resource link readme <file:///r.md>: the readme]"
    assert texts[1] == "[resource <mem://a> (text/plain)]\nbody"
    assert "mem://b" in texts[2] and "binary, not shown" in texts[2]
    assert "audio/wav" in texts[3] and "image/tiff" in texts[4]


def test_is_error_is_an_error_result_the_model_reads() -> None:
    output = _out(CallToolResult(content=[TextContent(text="no such ticket")], is_error=True))
    assert output.is_error is True and _texts(output) == ["no such ticket"]
    empty = _out(CallToolResult(content=[], is_error=True))
    assert empty.is_error is True and "error" in _texts(empty)[0]


def test_output_is_cut_with_a_note_saying_how_much() -> None:
    output = _out(
        CallToolResult(content=[TextContent(text="a" * 600), TextContent(text="b" * 600)]),
        max_chars=1000,
    )
    texts = _texts(output)
    assert texts[:2] == ["a" * 600, "b" * 400]
    assert "200 of 1,200 characters not shown" in texts[2]


def test_images_beyond_the_count_are_named_not_sent() -> None:
    blocks = [ImageContent(data=PNG, mime_type="image/png") for _ in range(MAX_IMAGES + 2)]
    output = _out(CallToolResult(content=blocks))
    assert sum(isinstance(p, ImagePart) for p in output.content) == MAX_IMAGES
    assert sum("over the limit" in text for text in _texts(output)) == 2


def test_malformed_results_are_error_results_not_exceptions() -> None:
    assert _out({"content": "x"}).is_error is True
    broken = CallToolResult.model_construct(content="not a list", is_error=False)  # type: ignore[arg-type]
    output = _out(broken)
    assert output.is_error is True and "malformed" in _texts(output)[0]


def test_an_image_is_told_as_what_its_bytes_are_and_one_no_model_takes_is_named() -> None:
    jpeg = base64.b64encode(image("jpg")).decode()
    garbage = base64.b64encode(b"\x89PNG but nothing after it").decode()
    output = _out(
        CallToolResult(
            content=[
                ImageContent(data=jpeg, mime_type="image/png"),  # a server that mislabels
                ImageContent(data=garbage, mime_type="image/png"),
                ImageContent(data="not base64!", mime_type="image/png"),
            ]
        )
    )
    first, rest = output.content[0], output.content[1:]
    # a provider refuses a declared type its bytes do not match, in this request and every
    # later one of the thread (D287)
    assert first == ImagePart(media_type="image/jpeg", data=jpeg)
    assert not any(isinstance(p, ImagePart) for p in rest)
    text = " ".join(p.text for p in rest if isinstance(p, TextPart))
    assert "not a PNG, JPEG, GIF or WebP image" in text
    assert "not valid base64" in text
