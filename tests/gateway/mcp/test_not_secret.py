"""An MCP server's settings that are no secrets: named in ``not_secret``, never redacted (D307).

Every ``env`` and ``headers`` value is a secret by default and is redacted wherever it appears.
``NODE_ENV = "production"`` made every "production" in every answer read ``[redacted]``; the
start now warns about a value that reads like a word, and ``not_secret`` keeps it shown.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import pytest

from gateway.channels import gateway_settings
from gateway.mcp.settings import McpServer, mcp_secrets
from gateway.redact import MIN_SECRET_CHARS
from tests.support.service_rig import serving

pytestmark = pytest.mark.timeout(60)

ROOT = str(Path(__file__).resolve().parents[3])


def _stdio(**fields: Any) -> dict[str, Any]:
    return {
        "name": "demo",
        "command": sys.executable,
        "args": ["-m", "tests.support.mcp_servers", "--stdio"],
        "cwd": ROOT,
        **fields,
    }


def test_values_named_not_secret_are_not_handed_to_the_redactor() -> None:
    settings = gateway_settings(
        mcp_servers=(
            _stdio(
                env={"NODE_ENV": "production", "TICKETS_TOKEN": "tickets-token-1"},
                not_secret=["NODE_ENV"],
            ),
            {
                "name": "docs",
                "url": "https://mcp.example.com/mcp",
                "headers": {"Accept": "application/json", "X-Api-Key": "header-key-1"},
                "not_secret": ["accept"],  # a header's name in any case
            },
        )
    )
    secrets = set(mcp_secrets(settings))
    assert {"tickets-token-1", "header-key-1"} <= secrets
    assert not {"production", "application/json"} & secrets


def test_a_name_in_not_secret_must_be_one_of_the_server_s() -> None:
    with pytest.raises(ValueError, match="not_secret names 'NODE_ENV', which is in neither"):
        McpServer.model_validate(_stdio(env={"TOKEN": "t0ken-value"}, not_secret=["NODE_ENV"]))


def test_a_secret_that_reads_like_a_word_is_named() -> None:
    server = McpServer.model_validate(
        {
            "name": "docs",
            "url": "https://mcp.example.com/mcp",
            "headers": {
                "Accept": "application/json",
                "X-Mode": "development",
                "X-Api-Key": "sk-3f9a81c2d7",
                "X-Short": "debug",  # under the redactor's length: never redacted anyway
            },
        }
    )
    assert server.word_valued(MIN_SECRET_CHARS) == ["header Accept", "header X-Mode"]


async def test_an_answer_keeps_a_word_named_not_secret(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def settings(**server: Any) -> Any:
        return gateway_settings(
            store_url=f"sqlite:///{tmp_path}/store.db",
            broker_url=f"sqlite:///{tmp_path}/broker.db",
            web_url=f"sqlite:///{tmp_path}/web.db",
            mcp_servers=(_stdio(**server),),
        )

    with caplog.at_level(logging.WARNING, logger="gateway.mcp"):
        async with serving(settings(env={"NODE_ENV": "production"})) as rig:
            await rig.post("t1", "deploy to production")
            [secret] = await rig.answers("t1", 1)
    assert secret["text"] == "You said: deploy to [redacted]"  # a secret is never shown
    [warning] = [r for r in caplog.records if "mcp.word_kept_secret" in r.getMessage()]
    fields = getattr(warning.msg, "fields", {})
    assert (fields["server"], fields["setting"]) == ("demo", "NODE_ENV")
    assert "production" not in repr(fields)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gateway.mcp"):
        async with serving(
            settings(env={"NODE_ENV": "production"}, not_secret=["NODE_ENV"])
        ) as rig:
            await rig.post("t2", "deploy to production")
            [plain] = await rig.answers("t2", 1)
    assert plain["text"] == "You said: deploy to production"
    assert not [r for r in caplog.records if "mcp.word_kept_secret" in r.getMessage()]
