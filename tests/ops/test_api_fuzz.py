"""The operator API fuzzed from its own OpenAPI schema (schemathesis) against `gateway serve`.

With an operator token no generated request gets a 5xx, and every refusal is in the envelope;
without a token every route answers 401 (authentication comes before any parameter is judged);
a viewer token never acts. The store is unchanged by all of it: refusals store nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from harness_core import open_repo
from harness_core.session import OperationStarted, StoredRecord
from tests.support.gateway_process import GatewayProcess

OPERATOR = "fuzz-operator-secret-0123456789"
VIEWER = "fuzz-viewer-secret-0123456789ab"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    where = tmp_path_factory.mktemp("fuzz")
    settings = {
        "store_url": f"sqlite:///{where}/store.db",
        "broker_url": f"sqlite:///{where}/broker.db",
        "web_url": f"sqlite:///{where}/web.db",
        "plugin": "tests.support.gateway_agent",
        "ops_tokens": f"alice:operator:{OPERATOR},bob:viewer:{VIEWER}",
    }
    process = GatewayProcess("fuzz", where, settings).start()
    try:
        for thread, text in (("one", "hello"), ("ship", "/deploy prod"), ("bad", "/fail")):
            posted = httpx.post(
                f"{process.url}/web/threads/{thread}/messages", json={"text": text}, timeout=10
            )
            assert posted.status_code == 202, posted.text
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def operations(gateway: GatewayProcess) -> list[Any]:
    schema = schemathesis.openapi.from_url(f"{gateway.url}/api/v1/openapi.json")
    found = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    mine = [op for op in found if op.path.startswith("/api/v1/")]
    assert len(mine) >= 17
    return mine


FUZZ = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))


def fuzz(operations: list[Any], check: Callable[[Any], None], method: str | None = None) -> None:
    """Run `check` on generated cases of every operation (schemathesis strategies, hypothesis).

    schemathesis's own pytest plugin does not run under pytest 9, so the strategies are driven
    here directly.
    """
    for operation in operations:
        if method is not None and operation.method.upper() != method:
            continue

        @FUZZ
        @given(case=operation.as_strategy())
        def one(case: Any) -> None:
            check(case)

        one()


def test_no_request_gets_a_server_error(operations: list[Any]) -> None:
    def check(case: Any) -> None:
        response = case.call(headers={"Authorization": f"Bearer {OPERATOR}"}, timeout=30)
        assert response.status_code < 500, (case.method, case.path, response.text[:500])
        if response.status_code >= 400:
            error = response.json()["error"]
            assert error["code"] and error["message"] and error["request_id"]

    fuzz(operations, check)


def test_without_a_token_every_request_is_401(operations: list[Any]) -> None:
    def check(case: Any) -> None:
        response = case.call(headers={"Authorization": ""}, timeout=30)
        assert response.status_code == 401, (case.method, case.path, response.text[:300])

    fuzz(operations, check)


def test_a_viewer_never_acts(operations: list[Any]) -> None:
    def check(case: Any) -> None:
        response = case.call(headers={"Authorization": f"Bearer {VIEWER}"}, timeout=30)
        assert response.status_code in (400, 403, 404, 428), (case.path, response.text[:300])

    fuzz(operations, check, method="POST")


def test_the_fuzzing_left_the_lanes_as_they_were(gateway: GatewayProcess) -> None:
    """Runs after the fuzz tests (file order): the three lanes hold what their messages made."""
    store = Path(gateway.env["GATEWAY_STORE_URL"].removeprefix("sqlite:///"))

    async def lanes() -> dict[str, int]:
        repo = open_repo(f"sqlite:///{store}")
        try:
            storage = await repo.open("web-default")
            try:
                counts: dict[str, int] = {}
                for item in await storage.get_log():
                    if isinstance(item, StoredRecord) and isinstance(item.record, OperationStarted):
                        counts[item.record.lane] = counts.get(item.record.lane, 0) + 1
                return counts
            finally:
                await storage.close()
        finally:
            await repo.close()

    assert asyncio.run(lanes()) == {"web:one": 1, "web:ship": 1, "web:bad": 1}
