"""The web channel in the registry: always on, its threads kept where ``[web] url`` says."""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from urllib.parse import quote

from adapters.channel import ChannelAdapter
from adapters.kit import ChannelContext, ChannelSpec
from adapters.web.settings import WebSettings

__all__ = ["SPEC"]


def _build(section: WebSettings, context: ChannelContext) -> ChannelAdapter:
    from adapters.web.channel import WebChannel
    from adapters.web.login import WebLogin

    logins = section.logins()
    return WebChannel(
        section.effective_url(context.shared_url),  # its URL: said when it cannot be used
        clock=context.clock,
        login=WebLogin(logins) if logins else None,
        secure_cookie=(context.public_url or "").startswith("https://"),
    )


def _describe(section: WebSettings, context: ChannelContext) -> Sequence[str]:
    base = context.base_url
    # the first space a route names (the walkthrough's `desk`, with its profile), else the
    # default space
    space = next(iter(context.spaces.get("web", ())), None)
    query = "" if space is None else f"?space={quote(space, safe='')}"
    body = json.dumps({"text": "hello"} if space is None else {"space": space, "text": "hello"})
    if section.tokens:  # the secrets are never printed: the lines name where they go
        bearer = "-H 'authorization: Bearer <your web token>' "
        return [
            f"  open {base}/web/threads/hello/page{query} and sign in with a web token, or:",
            f"  curl -s -X POST {base}/web/threads/hello/messages {bearer}"
            f"-H 'content-type: application/json' -d {shlex.quote(body)}",
        ]
    return [
        f"  open {base}/web/threads/hello/page{query} and write, or:",
        f"  curl -s -X POST {base}/web/threads/hello/messages "
        f"-H 'content-type: application/json' -d {shlex.quote(body)}",
        f"  curl -s '{base}/web/threads/hello{query}'"
        if query
        else f"  curl -s {base}/web/threads/hello",
    ]


SPEC = ChannelSpec(
    name="web",
    section=WebSettings,
    enabled=lambda section: True,
    build=_build,
    describe=_describe,
    state_url=lambda section, context: section.effective_url(context.shared_url),
)
