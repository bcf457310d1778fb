"""Compaction and navigation: the structural operations, and compaction inside a run."""

from __future__ import annotations

from typing import Literal

from pydantic import ValidationError

from harness_core._runtime.context import estimate_tokens, plan_compaction, summary_request_text
from harness_core._runtime.procedures.common import (
    OperationContext,
    Part,
    _Aborted,
    _Park,
    _RunFailed,
    _truncation,
)
from harness_core._runtime.procedures.steps import Steps
from harness_core._runtime.reduction import (
    OperationState,
)
from harness_core.events import (
    CompactionEnd,
    CompactionStart,
    NavigationEnd,
)
from harness_core.frozen import (
    freeze_json,
    invalid_reason,
    revalidated,
)
from harness_core.hooks import (
    BeforeCompactionEvent,
    BeforeCompactionResult,
    BeforeNavigationEvent,
    BeforeNavigationResult,
    CompactionPreparation,
    SummaryResult,
)
from harness_core.messages import (
    TokenUsage,
)
from harness_core.result import Outcome
from harness_core.session.entries import BranchSummaryEntry, CompactionEntry, Entry, MessageEntry
from harness_core.session.records import (
    CompactionIntent,
    CompactionReason,
    NavigationIntent,
    OperationError,
    StepAttempt,
    Usage,
)
from harness_core.session.types import LabelFact

__all__ = ["Structural"]


class Structural(Part):
    """Compaction (manual and automatic) and navigation, with their summary steps."""

    def __init__(self, ctx: OperationContext, steps: Steps) -> None:
        super().__init__(ctx)
        self.steps = steps

    async def _preparation(self) -> CompactionPreparation:
        entries = await self.lane.context.entries()
        messages = await self.lane.context.messages()
        keep = self.rt.options.compaction.keep_recent_tokens
        info = self.rt.model.model_info(self._model())
        if info is not None:
            keep = self.rt.options.compaction.within(info.context_window)[1]
        to_summarize, tail = plan_compaction(messages, keep)
        if entries and isinstance(entries[0].entry, CompactionEntry) and len(to_summarize) <= 1:
            # only the newest summary would be summarized again: it cannot get smaller
            to_summarize, tail = (), tuple(messages)
        return CompactionPreparation(
            to_summarize=to_summarize,
            retained_tail=tail,
            tokens_before=estimate_tokens(messages, self._system_prompt()),
        )

    async def context_over_limit(self) -> bool:
        settings = self.rt.options.compaction
        if not settings.enabled:
            return False
        info = self.rt.model.model_info(self._model())
        if info is None:
            return False
        tokens = await self.lane.context.tokens(self._system_prompt())
        reserve, _ = settings.within(info.context_window)
        return tokens > info.context_window - reserve

    async def auto_compact(self, reason: CompactionReason) -> None:
        """Compact inside a run (no operation of its own)."""
        fx = self.fx
        op = self.op
        name = self.lane.name
        step = op.step
        resuming = step is not None and step.kind == "compaction"
        result_id = step.result_entry_id if resuming and step is not None else self._id()
        prep = await self._preparation()
        self._emit(CompactionStart(lane=name, run_id=op.id, reason=reason, recovery=resuming))
        if not resuming:
            if not prep.to_summarize:
                self._emit(
                    CompactionEnd(lane=name, run_id=op.id, reason=reason, outcome="declined")
                )
                if reason == "overflow":
                    raise _RunFailed(_truncation())
                return
            hook = await fx.run_hook(
                "before_compaction",
                BeforeCompactionEvent(lane=name, reason=reason, preparation=prep),
            )
            if isinstance(hook, BeforeCompactionResult) and hook.decline:
                self._emit(
                    CompactionEnd(lane=name, run_id=op.id, reason=reason, outcome="declined")
                )
                if reason == "overflow":
                    raise _RunFailed(_truncation())
                return
            supplied = (
                self._checked_summary("before_compaction", hook.compaction)
                if isinstance(hook, BeforeCompactionResult)
                else None
            )
            if supplied is not None:
                if reason == "overflow":  # the once-per-input guard must count it
                    await fx.append_record(
                        StepAttempt(
                            id=self._id(),
                            lane=name,
                            run_id=op.id,
                            step="compaction",
                            attempt=1,
                            result_entry_id=result_id,
                            compaction_reason=reason,
                        )
                    )
                await self._hook_usage(result_id, supplied)
                await fx.append_entry_if_missing(
                    self._compaction_entry(result_id, supplied.summary, prep, supplied)
                )
                self._emit(
                    CompactionEnd(
                        lane=name,
                        run_id=op.id,
                        reason=reason,
                        outcome="completed",
                        entry_id=result_id,
                        from_hook=True,
                    )
                )
                return
        summary, usage = await self.steps.summary_step(
            "compaction", reason, result_id, summary_request_text(prep.to_summarize, None)
        )
        await fx.append_entry_if_missing(
            self._compaction_entry(result_id, summary, prep, None, usage)
        )
        self._emit(
            CompactionEnd(
                lane=name, run_id=op.id, reason=reason, outcome="completed", entry_id=result_id
            )
        )

    def _checked_summary(self, hook: str, supplied: SummaryResult | None) -> SummaryResult | None:
        """A hook-supplied summary that can be stored, or None (reported) if it cannot."""
        if supplied is None:
            return None
        try:
            usage = revalidated(supplied.usage) if supplied.usage is not None else None
            details = freeze_json(supplied.details)
        except (ValidationError, ValueError) as exc:
            reason = invalid_reason(exc) if isinstance(exc, ValidationError) else str(exc)
            self.rt.report("hook", hook, f"invalid summary ignored ({reason})")
            return None
        return SummaryResult(summary=str(supplied.summary), details=details, usage=usage)

    async def _hook_usage(self, entry_id: str, supplied: SummaryResult) -> None:
        if supplied.usage is not None:
            await self.fx.append_record(
                Usage(
                    id=self._id(),
                    lane=self.lane.name,
                    cause="hook",
                    run_id=self.op.id,
                    entry_id=entry_id,
                    usage=supplied.usage,
                )
            )

    def _compaction_entry(
        self,
        entry_id: str,
        summary: str,
        prep: CompactionPreparation,
        supplied: SummaryResult | None,
        usage: TokenUsage | None = None,
    ) -> CompactionEntry:
        return CompactionEntry(
            id=entry_id,
            summary=summary,
            retained_tail=prep.retained_tail,
            tokens_before=prep.tokens_before,
            details=supplied.details if supplied else None,
            usage=supplied.usage if supplied else usage,
        )

    async def compaction(self) -> Outcome:
        """The manual compaction operation."""
        fx = self.fx
        op = self.op
        intent = op.intent
        assert isinstance(intent, CompactionIntent)
        name = self.lane.name
        self._emit(
            CompactionStart(lane=name, run_id=op.id, reason="manual", recovery=op.step is not None)
        )
        try:
            if op.aborting:
                return await self._finish_structural("aborted")
            if not op.result_written:
                prep = await self._preparation()
                supplied: SummaryResult | None = None
                if op.step is None:  # no attempt yet: the decision hook may still run
                    hook = await fx.run_hook(
                        "before_compaction",
                        BeforeCompactionEvent(
                            lane=name,
                            reason="manual",
                            preparation=prep,
                            custom_instructions=intent.custom_instructions,
                        ),
                    )
                    if isinstance(hook, BeforeCompactionResult) and hook.decline:
                        return await self._finish_structural("declined")
                    if isinstance(hook, BeforeCompactionResult):
                        supplied = self._checked_summary("before_compaction", hook.compaction)
                    if supplied is not None:
                        await self._hook_usage(intent.result_entry_id, supplied)
                if supplied is not None:
                    entry = self._compaction_entry(
                        intent.result_entry_id, supplied.summary, prep, supplied
                    )
                else:
                    summary, usage = await self.steps.summary_step(
                        "compaction",
                        "manual",
                        intent.result_entry_id,
                        summary_request_text(prep.to_summarize, intent.custom_instructions),
                    )
                    entry = self._compaction_entry(
                        intent.result_entry_id, summary, prep, None, usage
                    )
                await fx.append_entry_if_missing(entry)
            return await self._finish_structural("completed")
        except (_Aborted, _RunFailed, _Park) as signal:
            return await self._structural_signal(signal)

    async def _abandoned(self, source: str | None, target: str | None) -> tuple[Entry, ...]:
        """The entries on the source path that the target's path does not share."""
        if source is None:
            return ()
        from harness_core.session.types import BranchQuery

        storage = self.rt.storage
        target_ids: set[str] = set()
        if target is not None:
            target_ids = {
                e.id for e in await storage.find_entries_on_branch(BranchQuery(start=target))
            }
        abandoned: list[Entry] = []
        for stored in await storage.find_entries_on_branch(BranchQuery(start=source)):
            if stored.id in target_ids:
                break
            abandoned.append(stored.entry)
        return tuple(reversed(abandoned))

    async def navigation(self) -> Outcome:
        """The navigation operation: move first (the commit point), then summary and label."""
        fx = self.fx
        op = self.op
        intent = op.intent
        assert isinstance(intent, NavigationIntent)
        old_leaf = op.source_leaf_id
        try:
            if op.aborting:
                return await self._finish_structural("aborted")
            # the move is the commit point: after it the leaf is the target, or the branch
            # summary appended below it
            moved = self.lane.state.leaf_id == intent.target_id or op.result_written
            summary: SummaryResult | None = None
            abandoned: tuple[Entry, ...] = ()
            if intent.summarize and not op.result_written:
                abandoned = await self._abandoned(op.source_leaf_id, intent.target_id)
                if not moved and op.step is None:  # the decision hook: once, before the move
                    hook = await fx.run_hook(
                        "before_navigation",
                        BeforeNavigationEvent(
                            lane=self.lane.name, target_id=intent.target_id, abandoned=abandoned
                        ),
                    )
                    if isinstance(hook, BeforeNavigationResult) and hook.decline:
                        return await self._finish_structural("declined")
                    if isinstance(hook, BeforeNavigationResult):
                        summary = self._checked_summary("before_navigation", hook.summary)
                    if summary is not None:
                        assert intent.summary_entry_id is not None
                        await self._hook_usage(intent.summary_entry_id, summary)
                if summary is None:
                    assert intent.summary_entry_id is not None
                    messages = tuple(e.message for e in abandoned if isinstance(e, MessageEntry))
                    text, usage = await self.steps.summary_step(
                        "branch_summary",
                        None,
                        intent.summary_entry_id,
                        summary_request_text(messages, intent.custom_instructions),
                    )
                    summary = SummaryResult(summary=text, usage=usage)
            if not moved:
                await fx.move_lane(intent.target_id)  # THE commit point
            if intent.summarize and not self.op.result_written and summary is not None:
                assert intent.summary_entry_id is not None
                await fx.append_entry_if_missing(
                    BranchSummaryEntry(
                        id=intent.summary_entry_id,
                        from_id=op.source_leaf_id or "root",
                        summary=summary.summary,
                        details=summary.details,
                        usage=summary.usage,
                    )
                )
            if intent.label is not None and intent.target_id is not None:
                await fx.set_fact(LabelFact(target_id=intent.target_id, label=intent.label))
            outcome = await self._finish_structural("completed")
            self._emit(
                NavigationEnd(
                    lane=self.lane.name,
                    run_id=op.id,
                    outcome="completed",
                    old_leaf_id=old_leaf,
                    new_leaf_id=self.lane.state.leaf_id,
                    summary_entry_id=intent.summary_entry_id if intent.summarize else None,
                )
            )
            return outcome
        except (_Aborted, _RunFailed, _Park) as signal:
            return await self._structural_signal(signal)

    async def _finish_structural(
        self, outcome: Literal["completed", "declined", "aborted"]
    ) -> Outcome:
        op = self.op
        error = op.abort_reason if outcome == "aborted" else None  # said with the abort (D266)
        result = await self.fx.finish_operation(op.id, outcome, error)
        if result == "continue":  # an abort won the ordering
            return await self._finish_structural("aborted")
        return self._structural_outcome(op, outcome, error)

    def _structural_outcome(
        self,
        op: OperationState,
        kind: Literal["completed", "declined", "aborted", "failed"],
        error: OperationError | None = None,
    ) -> Outcome:
        intent = op.intent
        entry_id = None
        if kind == "completed":
            if isinstance(intent, CompactionIntent):
                entry_id = intent.result_entry_id
            elif isinstance(intent, NavigationIntent):
                entry_id = intent.summary_entry_id
        if isinstance(intent, CompactionIntent):
            self._emit(
                CompactionEnd(
                    lane=self.lane.name,
                    run_id=op.id,
                    reason="manual",
                    outcome=kind,
                    entry_id=entry_id,
                    error=error,
                )
            )
        operation: Literal["compaction", "navigation"] = (
            "compaction" if isinstance(intent, CompactionIntent) else "navigation"
        )
        return Outcome(
            operation=operation,
            run_id=op.id,
            kind=kind,
            leaf_id=self.lane.state.leaf_id,
            error=error,
            entry_id=entry_id,
        )

    async def _structural_signal(self, signal: BaseException) -> Outcome:
        op = self.op
        if (
            isinstance(signal, _RunFailed)
            and await self.fx.finish_operation(op.id, "failed", signal.error) == "finished"
        ):
            return self._structural_outcome(op, "failed", signal.error)
        return await self._finish_structural("aborted")
