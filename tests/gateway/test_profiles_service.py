"""Agent profiles in one deployment: two routes, two agents (issue 26, item 4).

A whole `Service` on SQLite with the real web channel and a scripted model that records every
request. The web space ``oncall`` routes to the ``oncall`` profile (deploy tools, approvers,
one attempt), the space ``support`` to the ``support`` profile (ticket tools minus delete, its
own model, ``next_run``). Each thread's model requests carry only its profile's tools and its
instructions with where it is; a profile changed between two runs takes effect on the next
run and shows in the lane's timeline, while a run resumed after a restart keeps what it began
with; busy policy, attempt cap and approvers follow the thread's profile.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from adapters.channel import Author, DecisionInbound, DecisionItem, DecisionRefused, ThreadRef
from config import Profile, Route, Settings
from gateway.broker import open_broker
from gateway.channels import gateway_settings
from gateway.metrics import Metrics
from gateway.ops.views import lane_id
from gateway.profiles import LaneProfiles
from gateway.service import Service, ServiceParts
from harness_core import (
    AssistantMessage,
    ModelRef,
    ModelRequest,
    ScriptedModel,
    SystemClock,
    Tool,
    ToolContext,
    ToolResultMessage,
    UserMessage,
    message_text,
    open_repo,
    tool,
)
from harness_core.models.scripted import text, tool_call
from tests.support.gateway_rig import decision_body

OPERATOR = "operator-secret-abcdefghijklmnop"
AS_OPERATOR = {"Authorization": f"Bearer {OPERATOR}"}
MODEL = ModelRef(provider="scripted", model_id="house")
ONCALL = Profile(
    name="oncall",
    instructions="You are the on-call agent. Deploy only what you are asked to.",
    allow_tools=("deploys.*", "search_docs", "hold"),
    approvers=("alice", "bob"),
    max_attempts=1,
)
SUPPORT = Profile(
    name="support",
    instructions="You help customers with their tickets.",
    model="scripted:support-model",
    allow_tools=("tickets.*", "hold"),
    deny_tools=("tickets.delete",),
    busy_policy="next_run",
    max_turns=2,
)


class Target(BaseModel):
    target: str = "prod"


@dataclass
class Agent:
    """The tools (dotted names stand for MCP tools) and a gate that holds ``hold`` calls."""

    release: asyncio.Event = field(default_factory=asyncio.Event)
    holding: dict[str, asyncio.Event] = field(default_factory=dict)
    deployed: list[str] = field(default_factory=list)

    def held(self, lane: str) -> asyncio.Event:
        return self.holding.setdefault(lane, asyncio.Event())

    def tools(self) -> list[Tool]:
        @tool(name="tickets.search", replay="safe")
        async def search(args: dict[str, Any], ctx: ToolContext) -> str:
            "Search tickets."
            return "ticket 7"

        @tool(name="tickets.delete")
        async def delete(args: dict[str, Any], ctx: ToolContext) -> str:
            "Delete a ticket."
            return "deleted"

        @tool(name="deploys.run", requires_approval=True)
        async def deploy(args: Target, ctx: ToolContext) -> str:
            "Deploy a target."
            self.deployed.append(args.target)
            return f"deployed {args.target}"

        @tool(name="search_docs", replay="safe")
        async def docs(args: dict[str, Any], ctx: ToolContext) -> str:
            "Search the docs."
            return "the docs"

        @tool(name="hold", replay="safe")
        async def hold(args: dict[str, Any], ctx: ToolContext) -> str:
            "Wait until released."
            self.held(ctx.lane).set()
            await self.release.wait()
            return "held"

        return [search, delete, deploy, docs, hold]


def respond(request: ModelRequest) -> AssistantMessage:
    """``/deploy`` and ``/hold`` call those tools; a tool result is acknowledged; ``/loop``
    searches after every result, never answering; else echo."""
    last = request.messages[-1]
    users = [m for m in request.messages if isinstance(m, UserMessage)]
    said = message_text(users[-1]).split("] ")[-1] if users else ""
    if said == "/loop":
        return tool_call("search_docs" if "search_docs" in _tools(request) else "tickets.search")
    if isinstance(last, ToolResultMessage):
        return text(f"Done: {message_text(last)}")
    if said == "/deploy":
        return tool_call("deploys.run", {"target": "prod"})
    if said == "/hold":
        return tool_call("hold", {})
    return text(f"You said: {said}")


@dataclass
class Deployment:
    """A running service with the two routes, its HTTP client and its model's requests."""

    service: Service
    http: httpx.AsyncClient
    model: ScriptedModel

    async def post(self, space: str, thread: str, said: str, author: Any = "alice") -> None:
        body = {"text": said, "space": space, "author": author}
        response = await self.http.post(f"/web/threads/{thread}/messages", json=body)
        assert response.status_code == 202, response.text

    async def items(self, space: str, thread: str) -> list[dict[str, Any]]:
        response = await self.http.get(f"/web/threads/{thread}?space={space}")
        found: list[dict[str, Any]] = response.json()["items"]
        return found

    async def answers(self, space: str, thread: str, count: int) -> list[dict[str, Any]]:
        deadline = asyncio.get_running_loop().time() + 15
        while True:
            found = [
                i
                for i in await self.items(space, thread)
                if i["kind"] not in ("message", "decision", "approval_closed")
            ]
            if len(found) >= count:
                return found
            assert asyncio.get_running_loop().time() < deadline, found
            await asyncio.sleep(0.02)

    def asked(self, marker: str) -> list[ModelRequest]:
        """The model requests whose conversation began with a message holding `marker`."""
        return [
            r
            for r in self.model.requests
            if any(isinstance(m, UserMessage) and marker in message_text(m) for m in r.messages)
        ]

    async def timeline(self, session: str, lane: str) -> list[str]:
        path = f"/api/v1/lanes/{lane_id(session, lane)}/timeline?limit=500"
        response = await self.http.get(path, headers=AS_OPERATOR)
        assert response.status_code == 200, response.text
        return [item["summary"] for item in response.json()["items"]]


def _settings(
    tmp_path: Path, oncall: Profile = ONCALL, support: Profile = SUPPORT, **more: Any
) -> Settings:
    return gateway_settings(
        **more,
        store_url=f"sqlite:///{tmp_path}/store.db",
        broker_url=f"sqlite:///{tmp_path}/broker.db",
        web_url=f"sqlite:///{tmp_path}/web.db",
        lease_seconds=6,
        renew_seconds=1,
        ops_tokens=(f"alice:operator:{OPERATOR}",),
        instructions="You are the house agent.",
        profiles=(oncall, support),
        routes=(
            Route(channel="web", space="oncall", session="oncall", profile="oncall"),
            Route(channel="web", space="support", session="support", profile="support"),
            Route(channel="web", space="*", session="web"),
        ),
    )


Deploy = Callable[..., Any]


@pytest.fixture
async def deploy(tmp_path: Path) -> AsyncIterator[Deploy]:
    """Start deployments (one at a time: stop the last before starting the next)."""
    running: list[Service] = []
    clients: list[httpx.AsyncClient] = []

    async def start(agent: Agent, settings: Settings | None = None, **overrides: Any) -> Deployment:
        model = ScriptedModel(responder=respond)
        service = Service(
            settings or _settings(tmp_path),
            ServiceParts(model_client=model, model=MODEL, tools=agent.tools()),
        )
        for name, value in overrides.items():
            setattr(service, name, value)
        await service.start()
        running.append(service)
        assert service.app is not None
        http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=service.app), base_url="http://localhost"
        )
        clients.append(http)
        return Deployment(service, http, model)

    yield start
    for http in clients:
        await http.aclose()
    for service in running:
        await service.stop(drain_seconds=0.5)


def _tools(request: ModelRequest) -> set[str]:
    return {definition.name for definition in request.tools}


async def test_each_thread_sees_only_its_profile_tools_and_instructions(deploy: Deploy) -> None:
    web = await deploy(Agent())
    await web.post("oncall", "pager", "hello oncall")
    await web.post("support", "ticket-1", "hello support")
    await web.post("elsewhere", "chat", "hello house")
    assert (await web.answers("oncall", "pager", 1))[0]["text"] == "You said: hello oncall"
    assert (await web.answers("support", "ticket-1", 1))[0]["text"] == "You said: hello support"
    assert (await web.answers("elsewhere", "chat", 1))[0]["text"] == "You said: hello house"

    [oncall] = web.asked("hello oncall")
    assert _tools(oncall) == {"deploys.run", "search_docs", "hold"}
    assert oncall.model == MODEL  # the profile sets none: the service's
    assert oncall.system_prompt is not None
    assert oncall.system_prompt.startswith(ONCALL.instructions or "")
    assert "Channel: web\nSpace: oncall\nThread: pager\nStarted by: alice" in oncall.system_prompt
    assert "help customers" not in oncall.system_prompt

    [support] = web.asked("hello support")
    assert _tools(support) == {"tickets.search", "hold"}  # tickets.delete is denied
    assert support.model == ModelRef(provider="scripted", model_id="support-model")
    assert support.system_prompt is not None
    assert support.system_prompt.startswith("You help customers with their tickets.")
    assert "Space: support\nThread: ticket-1" in support.system_prompt

    [house] = web.asked("hello house")  # no profile named: the default, all tools
    assert _tools(house) == {
        "tickets.search",
        "tickets.delete",
        "deploys.run",
        "search_docs",
        "hold",
    }
    assert house.system_prompt is not None
    assert house.system_prompt.startswith("You are the house agent.")


async def test_who_wrote_is_a_bounded_tag_unless_they_started_the_thread(deploy: Deploy) -> None:
    web = await deploy(Agent())
    await web.post("oncall", "pager", "first", author={"id": "U1", "name": "Alice"})
    await web.answers("oncall", "pager", 1)
    await web.post(
        "oncall", "pager", "second", author={"id": "U2", "name": "Bob [admin]\n" + "x" * 80}
    )
    await web.answers("oncall", "pager", 2)  # its own run: a message to a busy lane steers it
    await web.post("oncall", "pager", "third", author={"id": "U1", "name": "Alice"})
    await web.answers("oncall", "pager", 3)
    last = web.model.requests[-1]
    said = [message_text(m) for m in last.messages if isinstance(m, UserMessage)]
    assert said[0] == "first" and said[2] == "third"  # the starter, named in the prompt
    assert said[1].startswith("[Bob admin x") and said[1].endswith("(U2)] second")
    assert len(said[1]) < 100  # the name is cut to 64 characters, brackets taken out
    assert last.system_prompt is not None and "Started by: Alice (U1)" in last.system_prompt
    prompts = {r.system_prompt for r in web.asked("first")}
    assert len(prompts) == 1  # stable for the lane's every request (the provider's cache holds)


async def test_a_profile_change_takes_effect_on_the_next_run_and_shows_in_the_timeline(
    deploy: Deploy, tmp_path: Path
) -> None:
    agent = Agent()
    web = await deploy(agent)
    await web.post("oncall", "pager", "/deploy")  # waits for approval, across the change
    [asked] = await web.answers("oncall", "pager", 1)
    await web.service.stop(drain_seconds=0.5)

    changed = ONCALL.model_copy(
        update={"instructions": "New rules: deploy on Tuesdays.", "allow_tools": ("tickets.*",)}
    )
    web = await deploy(agent, _settings(tmp_path, oncall=changed))
    approval = asked["approval"]  # named approvers: an operator decides it on the web (D297)
    calls = {c["tool_call_id"]: {"action": "approve"} for c in approval["calls"]}
    decided = await web.http.post(
        f"/api/v1/lanes/{lane_id('oncall', 'web:pager')}/decisions",
        json={"wait_id": approval["wait_id"], "approvals": calls},
        headers={**AS_OPERATOR, "Idempotency-Key": "k1"},
    )
    assert decided.status_code in (200, 202), decided.text
    # approved, yet the profile of now denies the tool: it is not run (D406), and the model
    # reads why
    said = (await web.answers("oncall", "pager", 2))[1]["text"]
    assert said == (
        "Done: the tool 'deploys.run' is no longer allowed in this thread (its profile "
        "changed): it was not run; do not call it again"
    )
    assert agent.deployed == []
    [resumed] = web.model.requests  # the run resumed after the restart: offered what it began with
    assert resumed.system_prompt is not None
    assert resumed.system_prompt.startswith("You are the on-call agent.")
    assert _tools(resumed) == {"deploys.run", "search_docs", "hold"}

    await web.post("oncall", "pager", "after the change")
    await web.answers("oncall", "pager", 3)
    [after] = web.asked("after the change")[-1:]
    assert after.system_prompt is not None
    assert after.system_prompt.startswith("New rules: deploy on Tuesdays.")
    assert _tools(after) == {"tickets.search", "tickets.delete"}

    summaries = await web.timeline("oncall", "web:pager")
    profiles = [s for s in summaries if s.startswith("profile oncall")]
    before = _settings(tmp_path).profile_named("oncall")
    now = _settings(tmp_path, oncall=changed).profile_named("oncall")
    assert before is not None and now is not None
    assert profiles == [
        f"profile oncall ({before.digest()}): model scripted:house, tools "
        "deploys.run, search_docs, hold",
        f"profile oncall ({now.digest()}): model scripted:house, tools "
        "tickets.search, tickets.delete",
    ]
    assert "tools: tickets.search, tickets.delete" in summaries
    change = summaries.index(profiles[1])
    tools = summaries.index("tools: tickets.search, tickets.delete")
    done = summaries.index(f"assistant: {said}")
    assert done < tools < change < summaries.index("user: after the change")  # between runs


async def test_busy_policy_is_the_profile_s(deploy: Deploy) -> None:
    agent = Agent()
    web = await deploy(agent)
    await web.post("oncall", "pager", "/hold")  # steer (the top level's)
    await web.post("support", "ticket-1", "/hold")  # next_run (the profile's)
    await agent.held("web:pager").wait()
    await agent.held("web:ticket-1").wait()
    await web.post("oncall", "pager", "steered in")
    await web.post("support", "ticket-1", "after it")
    broker = web.service.broker
    assert broker is not None
    deadline = asyncio.get_running_loop().time() + 15
    while await broker.inbox.pending("oncall", limit=8):  # steered: taken by the running run
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.02)
    [waiting] = await broker.inbox.pending("support", limit=8)  # next_run: waits for the run
    assert waiting.payload["text"] == "after it"
    agent.release.set()
    steered = await web.answers("oncall", "pager", 1)
    assert [a["text"] for a in steered] == ["You said: steered in"]  # in the same run
    queued = await web.answers("support", "ticket-1", 2)
    assert [a["text"] for a in queued] == ["Done: held", "You said: after it"]  # a run of its own


async def test_the_attempt_cap_is_the_profile_s(deploy: Deploy, tmp_path: Path) -> None:
    agent = Agent()
    web = await deploy(agent)
    await web.post("oncall", "pager", "/hold")  # max_attempts 1 (the profile's)
    await web.post("support", "ticket-1", "/hold")  # 3 (the top level's)
    await agent.held("web:pager").wait()
    await agent.held("web:ticket-1").wait()
    await web.service.stop(drain_seconds=0.1)  # both runs cut inside the tool

    agent.release.set()
    web = await deploy(agent)
    [stuck] = await web.answers("oncall", "pager", 1)
    assert stuck["kind"] == "failure_notice" and "stuck" in stuck["text"]
    # operators see it stuck too, though the top-level cap (3) is not reached
    shown = await web.http.get(
        f"/api/v1/lanes/{lane_id('oncall', 'web:pager')}", headers=AS_OPERATOR
    )
    assert shown.status_code == 200, shown.text
    assert shown.json()["status"] == "stuck"
    assert shown.json()["max_attempts"] == 1  # its own cap, not the top level's 3
    [done] = await web.answers("support", "ticket-1", 1)
    assert done["text"] == "Done: held"  # resumed: its second attempt


async def test_the_metrics_judge_a_lane_by_its_own_attempt_cap(
    deploy: Deploy, tmp_path: Path
) -> None:
    # the top level allows one attempt, the support profile three: a support run cut once is
    # not stuck, though nobody holds its session to say that its next attempt is coming
    agent = Agent()
    lenient = SUPPORT.model_copy(update={"max_attempts": 3})
    settings = _settings(tmp_path, support=lenient, max_attempts=1)
    web = await deploy(agent, settings)
    await web.post("support", "ticket-1", "/hold")
    await agent.held("web:ticket-1").wait()
    await web.service.stop(drain_seconds=0.1)  # cut inside the tool, its lease let go
    agent.release.set()
    clock = SystemClock()
    assert settings.broker_url is not None
    repo, broker = open_repo(settings.store_url, clock=clock), open_broker(settings.broker_url)
    try:
        metrics = Metrics(repo, broker, clock, limits=LaneProfiles(settings, MODEL))
        scrape = (await metrics.text()).decode()
    finally:
        await broker.close()
        await repo.close()
    assert 'gateway_lanes{status="suspended"} 1.0' in scrape
    assert 'gateway_lanes{status="stuck"} 0.0' in scrape


async def test_the_turn_limit_is_the_profile_s(deploy: Deploy, tmp_path: Path) -> None:
    web = await deploy(Agent(), _settings(tmp_path, max_turns=3))
    await web.post("support", "ticket-1", "/loop")  # max_turns 2 (the profile's)
    await web.post("oncall", "pager", "/loop")  # 3 (the top level's)
    for space, thread, searched, turns in (
        ("support", "ticket-1", "tickets.search", 2),
        ("oncall", "pager", "search_docs", 3),
    ):
        [notice] = await web.answers(space, thread, 1)
        assert notice["kind"] == "failure_notice" and "(turn_limit)" in notice["text"]
        asked = [r for r in web.asked("/loop") if searched in _tools(r)]
        assert len(asked) == turns, (space, len(asked))


async def test_the_token_budget_is_the_profile_s(deploy: Deploy, tmp_path: Path) -> None:
    spends = SUPPORT.model_copy(update={"token_budget": 1})  # its first answer spends it
    web = await deploy(Agent(), _settings(tmp_path, support=spends, token_budget=10**9))
    for space, thread in (("support", "ticket-1"), ("oncall", "pager")):
        await web.post(space, thread, "hello")
        await web.answers(space, thread, 1)
        await web.post(space, thread, "hello again")
    [_, spent] = await web.answers("support", "ticket-1", 2)
    assert spent["kind"] == "failure_notice" and "(token_budget)" in spent["text"]
    [_, answered] = await web.answers("oncall", "pager", 2)
    assert answered["text"] == "You said: hello again"  # the top level's budget is far off
    # operators see each lane's own budget, and what its ledger holds against it
    for session, lane, budget in (("support", "web:ticket-1", 1), ("oncall", "web:pager", 10**9)):
        path = f"/api/v1/lanes/{lane_id(session, lane)}"
        shown = await web.http.get(path, headers=AS_OPERATOR)
        assert shown.json()["token_budget"] == budget, shown.text
        usage = (await web.http.get(f"{path}/usage", headers=AS_OPERATOR)).json()
        assert usage["budget"] == budget and usage["total"]["total_tokens"] > 1


def _vouched(approval: dict[str, Any], who: str, *, key: str = "k1") -> DecisionInbound:
    """An approval of every call of oncall/pager's request, from a channel that vouches for
    `who` (Slack, a signed link or webhook), not the web page."""
    return DecisionInbound(
        thread=ThreadRef(channel="web", space="oncall", thread="pager"),
        run_id=approval["run_id"],
        wait_id=approval["wait_id"],
        decisions=tuple(
            DecisionItem(
                tool_call_id=c["tool_call_id"], args_digest=c["args_digest"], approved=True
            )
            for c in approval["calls"]
        ),
        decided_by=Author(id=who),
        idempotency_key=key,
        received_at_ms=0,
        identified=True,
    )


async def test_with_web_tokens_a_profile_s_web_approvers_decide_on_the_page(
    deploy: Deploy, tmp_path: Path
) -> None:
    """The web channel vouches for a signed-in name (D380): a request with named approvers is
    decided from the page by one of them, and refused for anyone else signed in."""
    alice, mallory = "alice-web-secret-0123456789ab", "mallory-web-secret-0123456789"
    settings = _settings(tmp_path, web_tokens=f"alice:{alice},mallory:{mallory}")
    web = await deploy(Agent(), settings)
    web.http.headers["authorization"] = f"Bearer {alice}"
    await web.post("oncall", "pager", "/deploy")
    [asked] = await web.answers("oncall", "pager", 1)
    body = {**decision_body(asked["approval"], approved=True, key="k1"), "space": "oncall"}
    refused = await web.http.post(
        "/web/threads/pager/decisions", json=body, headers={"authorization": f"Bearer {mallory}"}
    )
    assert refused.status_code == 403, refused.text
    error = refused.json()["error"]
    assert error["code"] == "not_approver" and "cannot tell who you are" not in error["message"]
    approved = await web.http.post("/web/threads/pager/decisions", json=body)
    assert approved.status_code == 202, approved.text
    [_, done] = await web.answers("oncall", "pager", 2)
    assert done["text"].startswith("Done:"), done
    [decision] = [i for i in await web.items("oncall", "pager") if i["kind"] == "decision"]
    assert decision["author"]["id"] == "alice"


async def test_only_the_profile_s_and_the_tool_s_approvers_decide(deploy: Deploy) -> None:
    def tool_approvers(name: str) -> frozenset[str] | None:
        return frozenset({"bob"}) if name == "deploys.run" else None

    web = await deploy(Agent(), tool_approvers=tool_approvers)
    await web.post("oncall", "pager", "/deploy")
    [asked] = await web.answers("oncall", "pager", 1)
    body = {**decision_body(asked["approval"], approved=True, key="k1"), "space": "oncall"}
    # the web page has no login: whoever clicks names themselves, so named approvers' requests
    # are not decided there, whatever name is typed (an outside probe approved as "alice")
    for who in ("mallory", "alice", "bob"):
        refused = await web.http.post("/web/threads/pager/decisions", json={**body, "author": who})
        assert refused.status_code == 403, refused.text
        error = refused.json()["error"]
        assert error["code"] == "not_approver" and "cannot tell who you are" in error["message"]
    kinds = [i["kind"] for i in await web.items("oncall", "pager")]
    assert "decision" not in kinds  # nothing stored
    # a channel that vouches for its decider (Slack, a signed link or webhook): the profile's
    # approvers, then the tool's own
    intake = web.service.intake
    assert intake is not None
    approval = asked["approval"]

    for who, because in (("mallory", "approvers of this request,"), ("alice", "deploys.run")):
        with pytest.raises(DecisionRefused) as refusal:
            await intake.decide(_vouched(approval, who))
        assert refusal.value.code == "not_allowed" and because in refusal.value.message
        assert refusal.value.message.endswith("Nothing was recorded.")
    accepted = await intake.decide(_vouched(approval, "bob"))
    assert not accepted.duplicate
    assert (await web.answers("oncall", "pager", 2))[1]["text"] == "Done: deployed prod"


async def test_a_route_of_a_channel_that_is_not_configured_is_said_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A route to `slack` without Slack's token started without a word: its messages could
    never come, and nobody was told why the route took nothing."""
    settings = gateway_settings(
        store_url=f"sqlite:///{tmp_path}/store.db",
        broker_url=f"sqlite:///{tmp_path}/broker.db",
        web_url=f"sqlite:///{tmp_path}/web.db",
        routes=(Route(channel="slack", space="C1", session="ops"),),
    )
    service = Service(settings)
    with caplog.at_level("WARNING", logger="gateway.service"):
        await service.start()
    try:
        said = [r for r in caplog.records if r.getMessage() == "route of a channel not configured"]
        [warning] = said
        assert getattr(warning.msg, "fields", {})["channel"] == "slack"
    finally:
        await service.stop(drain_seconds=1)


async def test_a_thread_id_another_space_of_the_session_uses_is_not_its_thread(
    deploy: Deploy, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two web spaces routed to one session, one with named approvers: a decision naming the
    other space was judged by that space's (none), and the deploy ran (an outside probe); a
    message from it joined the first space's conversation (D332)."""
    routes = (
        Route(channel="web", space="secure", session="shared", profile="oncall"),
        Route(channel="web", space="lobby", session="shared"),
    )
    web = await deploy(Agent(), _settings(tmp_path).model_copy(update={"routes": routes}))
    await web.post("secure", "t1", "/deploy")
    [asked] = await web.answers("secure", "t1", 1)
    body = decision_body(asked["approval"], approved=True, key="k1")
    with caplog.at_level("WARNING", logger="gateway.intake"):
        refused = await web.http.post(
            "/web/threads/t1/decisions", json={**body, "space": "lobby", "author": "mallory"}
        )
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["code"] == "no_such_request"
    [attempt] = [r for r in caplog.records if r.getMessage() == "decision refused"]
    said = getattr(attempt.msg, "fields", {})  # who tried, from where: an operator sees it
    assert (said["decided_by"], said["space"], said["identified"]) == ("mallory", "lobby", False)
    joined = await web.http.post(
        "/web/threads/t1/messages", json={"space": "lobby", "text": "what did they plan?"}
    )
    assert joined.status_code == 404, joined.text
    error = joined.json()["error"]
    assert error["code"] == "not_routed"
    assert "belongs to another space of this session" in error["message"]
    assert "secure" not in error["message"]  # a space's name is not told to another's writers
    kinds = [i["kind"] for i in await web.items("secure", "t1")]
    assert "decision" not in kinds and kinds.count("message") == 1  # nothing of the lobby's
    lobby = await web.items("lobby", "t1")  # the person there sees why
    assert [i["kind"] for i in lobby] == ["message", "failure_notice"], lobby
    assert "belongs to another space" in lobby[1]["text"], lobby
    await web.post("lobby", "t2", "hello")  # the lobby's own threads are answered as before
    assert (await web.answers("lobby", "t2", 1))[0]["text"] == "You said: hello"


async def test_a_profile_pattern_that_names_no_tool_or_no_approver_is_said_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`deny_tools = ["tickets.delete"]` beside a server whose tool is tickets.delete_ticket
    took nothing away, without a word (an outside probe, following the README)."""
    typo = SUPPORT.model_copy(
        update={"deny_tools": ("tickets.delete", "tickets.close"), "approvers": ()}
    )
    service = Service(
        _settings(tmp_path, support=typo),
        ServiceParts(
            model_client=ScriptedModel(responder=respond), model=MODEL, tools=Agent().tools()
        ),
    )
    with caplog.at_level("WARNING", logger="gateway.service"):
        await service.start()
    try:
        said = [
            getattr(r.msg, "fields", {})
            for r in caplog.records
            if r.getMessage() == "profile pattern matches no tool"
        ]
        # tickets.delete is a tool here; no tool is tickets.close
        assert [(f["profile"], f["field"], f["pattern"]) for f in said] == [
            ("support", "deny_tools", "tickets.close")
        ]
        assert "ops mcp --tools" in said[0]["note"]
        # `approvers = []`: no one in a thread can decide (ONCALL names two; unset is the rule)
        [nobody] = [
            getattr(r.msg, "fields", {})
            for r in caplog.records
            if r.getMessage() == "profile names no approvers"
        ]
        assert nobody["profile"] == "support" and "gateway ops approve" in nobody["note"]
    finally:
        await service.stop(drain_seconds=0.5)


async def test_an_approver_s_address_is_matched_without_regard_to_case(
    deploy: Deploy, tmp_path: Path
) -> None:
    """The email channel vouches for `ann@example.com` (lowercased); the profile named
    `Ann@Example.COM`: the link mailed to her was refused "not among the approvers"."""
    named = ONCALL.model_copy(update={"approvers": ("Ann@Example.COM", "U0BOB")})
    web = await deploy(Agent(), _settings(tmp_path, oncall=named))
    await web.post("oncall", "pager", "/deploy")
    [asked] = await web.answers("oncall", "pager", 1)
    approval = asked["approval"]
    intake = web.service.intake
    assert intake is not None

    with pytest.raises(DecisionRefused):  # an id that is no address keeps its case (Slack's)
        await intake.decide(_vouched(approval, "u0bob", key="k0"))
    accepted = await intake.decide(_vouched(approval, "ann@example.com"))
    assert not accepted.duplicate
    assert (await web.answers("oncall", "pager", 2))[1]["text"] == "Done: deployed prod"
