"""The model client a service built from its settings is closed when the service stops.

Its providers' HTTP clients hold pooled connections; a service stopped in a process that goes
on (tests, an embedding host, a reload) would otherwise leave them open until the process ends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from config import Settings
from gateway.channels import gateway_settings
from gateway.models import model_from_settings
from gateway.service import Service
from harness_core import ModelRef
from harness_core.models.pydantic_ai import PydanticAIModel


async def test_the_model_client_it_built_is_closed_when_it_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[Any] = []

    def keeping(settings: Settings) -> Any:
        client, ref = model_from_settings(settings)
        built.append(client)
        return client, ref

    monkeypatch.setattr("gateway.service.model_from_settings", keeping)
    service = Service(
        gateway_settings(
            store_url=f"sqlite:///{tmp_path}/store.db",
            broker_url=f"sqlite:///{tmp_path}/broker.db",
            web_url=f"sqlite:///{tmp_path}/web.db",
            model="openai:gpt-4o-mini",
            model_api_key=SecretStr("sk-test-not-a-key"),
            model_base_url="http://127.0.0.1:9/v1",  # never reached: nothing is asked
        )
    )
    await service.start()
    [client] = built
    assert isinstance(client, PydanticAIModel)
    assert client.model_info(ModelRef(provider="openai", model_id="gpt-4o-mini")) is not None
    [provider_model] = client._models.values()
    http = provider_model.client  # type: ignore[union-attr]
    assert not http.is_closed()
    await service.stop(drain_seconds=0)
    assert http.is_closed()
