"""A gateway plugin for the files tests: a scripted model whose requests the tests read.

The model answers every message with a line per content part of the newest user message
(``text: <first line>`` or ``image: <media type>, <bytes> bytes``), and keeps every request it
receives (`requests`), so a test sees exactly what reached the model.
"""

from __future__ import annotations

import base64

from harness_core import (
    AssistantMessage,
    ImagePart,
    ModelRef,
    ModelRequest,
    ScriptedModel,
    TextPart,
    UserMessage,
)
from harness_core.models.scripted import text

MODEL = ModelRef(provider="scripted", model_id="files-test")
_MODELS: list[ScriptedModel] = []


def requests() -> list[ModelRequest]:
    """Every request the scripted models of this process received, in order."""
    return [request for model in _MODELS for request in model.requests]


def newest_user_parts() -> list[TextPart | ImagePart]:
    """The content parts of the newest user message any request carried."""
    for request in reversed(requests()):
        users = [m for m in request.messages if isinstance(m, UserMessage)]
        if users:
            return list(users[-1].content)
    raise AssertionError("no request carried a user message")


def respond(request: ModelRequest) -> AssistantMessage:
    """A line per content part of the newest user message."""
    users = [m for m in request.messages if isinstance(m, UserMessage)]
    lines = []
    for part in users[-1].content if users else ():
        if isinstance(part, ImagePart):
            lines.append(f"image: {part.media_type}, {len(base64.b64decode(part.data))} bytes")
        else:
            lines.append(f"text: {part.text.splitlines()[0] if part.text else ''}")
    return text("\n".join(lines) or "(nothing)")


def model() -> tuple[ScriptedModel, ModelRef]:
    """A scripted model, kept for `requests`."""
    _MODELS.append(ScriptedModel(responder=respond))
    return _MODELS[-1], MODEL
