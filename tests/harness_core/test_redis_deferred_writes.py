"""Redis: writes made inside `deferred_durability` are answered at once and sent together (D283).

A second repository (another process's view) shows what the server holds; the server's own
``INFO commandstats`` counts the script calls.
"""

from __future__ import annotations

import asyncio

import pytest
import redis

from harness_core import ScriptedModel, SessionRepo, SessionStorage
from harness_core.clock import SystemClock
from harness_core.errors import LeaseLost, SessionError
from harness_core.harness import AgentHarness
from harness_core.ids import SequentialIds
from harness_core.messages import AssistantMessage, ToolResultMessage
from harness_core.models import ModelRef, ModelRequest
from harness_core.models.scripted import text, tool_call
from harness_core.options import AgentHarnessOptions
from harness_core.result import Ok
from harness_core.session.durability import deferred_durability
from harness_core.session.types import StoredEntry, StoredRecord
from harness_core.storage.redis_streams import RedisSessionRepo
from harness_core.testing import ManualClock
from harness_core.testing.builders import (
    operation_finished,
    operation_started,
    step_attempt,
    user_entry,
)
from harness_core.tools import Tool, ToolContext


@pytest.fixture
async def repos(redis_server, redis_prefix):
    """The writer's repository and another process's view of the same server."""
    made = [
        RedisSessionRepo(redis_server.url, prefix=redis_prefix, clock=ManualClock()) for _ in "ab"
    ]
    yield made
    for each in made:
        await each.close()


@pytest.fixture
def repo(repos):
    return repos[0]


@pytest.fixture
def other(repos):
    return repos[1]


def script_calls(redis_server) -> int:
    client = redis.Redis(port=redis_server.port)
    try:
        stats = client.info("commandstats")
    finally:
        client.close()
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def _writer(repo: SessionRepo) -> SessionStorage:
    """A session whose writer knows its seq and its lane's leaf (its own writes told it)."""
    await repo.create("s1")
    lease = await repo.acquire_lease("s1", owner="w", ttl_ms=60_000)
    storage = await repo.open("s1", lease=lease)
    await storage.append_record(operation_started("run1"))
    await storage.append_entry(user_entry("u1"), "main")
    return storage


async def _held(repo: SessionRepo) -> tuple[int, set[str]]:
    """What the server holds: the newest seq, and every item id."""
    log = await (await repo.open("s1")).get_log()
    ids = {item.entry.id for item in log if isinstance(item, StoredEntry)}
    ids |= {item.record.id for item in log if isinstance(item, StoredRecord)}
    return log[-1].seq, ids


async def test_deferred_writes_are_answered_at_once_and_sent_in_one_call_at_the_barrier(
    repo, other, redis_server
) -> None:
    storage = await _writer(repo)
    before_seq, _ = await _held(other)
    calls = script_calls(redis_server)
    with deferred_durability():
        attempt = await storage.append_record(step_attempt("a1", "run1", 1, "m1"))
        answer = await storage.append_entry(user_entry("m1", "the answer"), "main")
        end = await storage.append_record(operation_finished("f1", "run1"))
    assert [attempt.seq, answer.seq, end.seq] == [before_seq + 1, before_seq + 2, before_seq + 3]
    assert answer.parent_id == "u1"
    assert script_calls(redis_server) == calls  # nothing sent yet
    assert (await _held(other))[0] == before_seq

    calls = script_calls(redis_server)
    await storage.sync(point=False)
    assert script_calls(redis_server) == calls + 1
    seq, ids = await _held(other)
    assert seq == before_seq + 3 and {"a1", "m1", "f1"} <= ids
    stored = await (await other.open("s1")).get_entry("m1")
    assert stored is not None
    assert (stored.seq, stored.timestamp, stored.parent_id) == (
        answer.seq, answer.timestamp, answer.parent_id,
    )  # fmt: skip


async def test_a_read_of_the_writer_sees_its_deferred_writes(repo, other) -> None:
    storage = await _writer(repo)
    with deferred_durability():
        await storage.append_entry(user_entry("m1"), "main")
    found = await storage.get_entry("m1")
    assert found is not None and found.parent_id == "u1"
    assert "m1" in (await _held(other))[1]  # the read sent them


async def test_a_durable_write_carries_the_deferred_ones_before_it_in_its_call(
    repo, other, redis_server
) -> None:
    storage = await _writer(repo)
    calls = script_calls(redis_server)
    with deferred_durability():
        await storage.append_record(step_attempt("a1", "run1", 1, "m1"))
    stored = await storage.append_entry(user_entry("m1"), "main")  # durable on return
    assert script_calls(redis_server) == calls + 1
    seq, ids = await _held(other)
    assert {"a1", "m1"} <= ids and seq == stored.seq


async def test_deferred_writes_a_process_never_sent_are_lost_as_a_suffix(repo, other) -> None:
    storage = await _writer(repo)
    before_seq, before = await _held(other)
    with deferred_durability():
        await storage.append_record(step_attempt("a1", "run1", 1, "m1"))
        await storage.append_entry(user_entry("m1"), "main")
    # the process dies here: nothing sent, the store is the prefix it was
    assert await _held(other) == (before_seq, before)


async def test_a_refused_deferred_write_skips_the_rest_of_its_call_and_fails_the_barrier(
    repo, other
) -> None:
    storage = await _writer(repo)
    before_seq, before = await _held(other)
    with deferred_durability():
        await storage.append_record(step_attempt("a1", "run1", 1, "m1"))
        await storage.append_record(step_attempt("u1", "run1", 2, "m1"))  # the id is taken
        await storage.append_entry(user_entry("m1"), "main")
    with pytest.raises(SessionError) as refused:
        await storage.sync()
    assert refused.value.code == "storage"
    assert "already" in str(refused.value)
    seq, ids = await _held(other)
    # the write before the refused one stands; none after it: still a prefix
    assert seq == before_seq + 1 and ids == before | {"a1"}
    with pytest.raises(SessionError):  # and the writer says so until it is reopened
        await storage.append_record(step_attempt("a3", "run1", 3, "m1"))


async def test_deferred_writes_of_a_superseded_lease_are_refused_at_the_barrier(
    repo, other
) -> None:
    storage = await _writer(repo)
    before = await _held(other)
    with deferred_durability():
        await storage.append_record(step_attempt("a1", "run1", 1, "m1"))
    await other.acquire_lease("s1", owner="w", ttl_ms=60_000)  # a restarted incarnation
    with pytest.raises(LeaseLost):
        await storage.sync()
    assert await _held(other) == before


async def test_a_write_is_not_deferred_before_the_writer_knows_the_session(repo) -> None:
    await repo.create("s1")
    lease = await repo.acquire_lease("s1", owner="w", ttl_ms=60_000)
    storage = await repo.open("s1", lease=lease)
    with deferred_durability():
        first = await storage.append_record(operation_started("run1"))  # never deferred
        entry = await storage.append_entry(user_entry("u1"), "main")  # leaf not known yet
    fresh = await repo.open("s1")
    assert (await fresh.get_entry("u1")) is not None
    assert entry.seq == first.seq + 1


async def test_a_read_while_another_task_sends_the_deferred_writes_waits_for_them(repo) -> None:
    storage = await _writer(repo)
    with deferred_durability():
        await storage.append_entry(user_entry("m1"), "main")
    barrier = asyncio.create_task(storage.sync(point=False))
    await asyncio.sleep(0)  # the barrier's send is under way: nothing is kept here any more
    found = await storage.get_entry("m1")
    await barrier
    assert found is not None and found.parent_id == "u1"


def _respond(request: ModelRequest) -> AssistantMessage:
    if isinstance(request.messages[-1], ToolResultMessage):
        return text("all green")
    return tool_call("lookup", {"query": "status"})


async def _lookup(args: object, ctx: ToolContext) -> str:
    return "green"


async def test_lanes_of_one_session_run_at_once_on_deferred_writes_and_the_log_holds_them(
    redis_server, redis_prefix
) -> None:
    """Eight lanes' turns at once: each turn's self-check reads what other lanes' barriers send."""
    repo = RedisSessionRepo(redis_server.url, prefix=redis_prefix, clock=SystemClock())
    try:
        await repo.create("s")
        lease = await repo.acquire_lease("s", owner="w", ttl_ms=60_000)
        storage = await repo.open("s", lease=lease)
        harness, _ = await AgentHarness.create(
            AgentHarnessOptions(
                storage=storage,
                model_client=ScriptedModel(responder=_respond),
                model=ModelRef(provider="scripted", model_id="m"),
                tools=[Tool(name="lookup", description="look", execute=_lookup, replay="never")],
                ids=SequentialIds("s-"),
            )
        )
        lanes: list[object] = [harness]
        for i in range(1, 8):
            created = await harness.create_lane(f"l{i}", None)
            assert isinstance(created, Ok)
            lanes.append(created.value)

        async def drive(lane: object) -> None:
            for _ in range(6):
                result = await lane.prompt("check")  # type: ignore[attr-defined]
                assert isinstance(result, Ok) and result.value.kind == "completed", result

        await asyncio.gather(*(drive(lane) for lane in lanes))
        await harness.close()
        log = await (await repo.open("s")).get_log()
        assert [item.seq for item in log] == list(range(1, len(log) + 1))
        finished = [
            i for i in log if isinstance(i, StoredRecord) and i.record.type == "operation_finished"
        ]
        assert len(finished) == 8 * 6
    finally:
        await repo.close()


async def test_a_refused_deferred_write_sent_by_a_read_fails_every_later_write(repo, other) -> None:
    storage = await _writer(repo)
    with deferred_durability():
        await storage.append_record(step_attempt("u1", "run1", 1, "m1"))  # the id is taken
    with pytest.raises(SessionError):
        await storage.get_entry("u1")  # the read sends it
    with pytest.raises(SessionError):  # nothing lands after what was lost
        await storage.append_entry(user_entry("m2"), "main")
    with pytest.raises(SessionError):
        await storage.sync()
    assert "m2" not in (await _held(other))[1]
