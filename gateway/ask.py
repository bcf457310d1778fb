"""``gateway ask``: one durable prompt on a lane of the configured model (the shortest real use).

With ``GATEWAY_MODEL`` unset the model is ``scripted:echo`` (no key needed). A lane keeps its
conversation across invocations, and an invocation that finds the lane's previous run open
(the process died) resumes it before asking.
"""

from __future__ import annotations

from config import Settings
from gateway.models import model_from_settings
from harness_core import (
    AgentHarness,
    AgentHarnessOptions,
    Ok,
    RequestOptions,
    SessionError,
    SessionRepo,
    message_text,
)

__all__ = ["SESSION", "ask"]

SESSION = "cli"


async def ask(
    repo: SessionRepo, settings: Settings, lane_name: str, question: str, out: list[str]
) -> int:
    """Ask `question` on lane `lane_name`; returns an exit status (1 if the run failed)."""
    client, model = model_from_settings(settings)
    try:
        await repo.create(SESSION)
    except SessionError as exc:
        if exc.code != "already_exists":
            raise
    lease = await repo.acquire_lease(SESSION, owner="gateway-ask", ttl_ms=300_000)
    try:
        storage = await repo.open(SESSION, lease=lease)
        harness, suspended = await AgentHarness.create(
            AgentHarnessOptions(
                storage=storage,
                model_client=client,
                model=model,
                request_options=RequestOptions(max_output_tokens=settings.model_max_output_tokens),
            )
        )
        for op in suspended:
            lane = harness.lane(op.lane)
            if lane is not None and op.lane == lane_name:
                out.append(f"(resuming an interrupted {op.kind} first)")
                await lane.resume()
        lane = harness.lane(lane_name)
        if lane is None:
            created = await harness.create_lane(lane_name, None)
            if not isinstance(created, Ok):
                out.append(f"gateway ask: {created.error.message}")
                return 1
            lane = created.value
        result = await lane.prompt(question)
        await harness.close()
    finally:
        await repo.release_lease(lease)
        close = getattr(client, "aclose", None)
        if close is not None:
            await close()
    if not isinstance(result, Ok):
        out.append(f"gateway ask: {result.error.message}")
        return 1
    outcome = result.value
    final = outcome.final_message
    if outcome.kind != "completed" or final is None:
        error = outcome.error.message if outcome.error else outcome.kind
        out.append(f"gateway ask: the run ended {outcome.kind}: {error}")
        return 1
    out.append(message_text(final))
    usage = final.usage
    if usage is not None:
        out.append(f"({model}: {usage.input} tokens in, {usage.output} out)")
    return 0
