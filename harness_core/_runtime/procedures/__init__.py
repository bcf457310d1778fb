"""The operation procedures: run, compaction and navigation, for live execution and resume alike.

Intent precedes effect everywhere: a `step_attempt` before each model request (its usage
recorded before any decision), a `tool_started` before each tool, provisioned ids for every
result. The parts: `runs` (the driver loop, failure, abort, deferred redemption), `steps` (the
one retry loop of every model request), `tool_batch` (prepare, execute, finalize, recover,
approvals) and `structural` (compaction and navigation); `common` holds what they share.
"""

from __future__ import annotations

from harness_core._runtime.effects import Effects
from harness_core._runtime.lane import LaneRuntime
from harness_core._runtime.procedures.common import OperationContext
from harness_core._runtime.procedures.runs import Run
from harness_core._runtime.procedures.steps import Steps
from harness_core._runtime.procedures.structural import Structural
from harness_core._runtime.procedures.tool_batch import ToolBatch
from harness_core.result import Outcome
from harness_core.tools import ToolRecovery

__all__ = ["OperationContext", "Procedures"]


class Procedures:
    """The procedures of one lane's open operation, wired together and acting through `fx`."""

    def __init__(
        self, lane: LaneRuntime, fx: Effects, tool_recovery: ToolRecovery = "declared"
    ) -> None:
        self.ctx = OperationContext(lane, fx, tool_recovery)
        self.steps = Steps(self.ctx)
        self.tools = ToolBatch(self.ctx)
        self.structural = Structural(self.ctx, self.steps)
        self.run = Run(self.ctx, self.steps, self.tools, self.structural)

    async def execute(self) -> Outcome:
        """Continue (or start) the open operation to its end or suspension."""
        kind = self.ctx.lane.operation.kind
        if kind == "run":
            return await self.run.run()
        if kind == "compaction":
            return await self.structural.compaction()
        return await self.structural.navigation()
