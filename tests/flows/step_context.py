"""A flow whose step reads its :class:`runner.flow.context.StepContext` (where it runs,
which attempt it is); the test workers import this module (allow-list)."""

from __future__ import annotations

from runner import Flow, FlowState, listen, start
from runner.flow.context import step_context


class WhereState(FlowState):
    seen: str = ""
    after: str = ""


class WhereFlow(Flow[WhereState]):
    """``where`` fails its first attempt, then records where and as which attempt it ran."""

    @start(retries=1, retry_backoff=0.05)
    def where(self) -> str:
        ctx = step_context()
        assert ctx is not None and ctx.runs(self, "where")
        if ctx.attempt == 1:
            raise RuntimeError("the first attempt fails")
        self.state.seen = f"{ctx.executor}:{ctx.attempt}"
        return self.state.seen

    @listen(where)
    def then(self, seen: str) -> str:
        ctx = step_context()
        assert ctx is not None
        self.state.after = f"{ctx.executor}:{ctx.attempt}"
        return f"{seen} then {self.state.after}"


class OutputsFlow(Flow[FlowState]):
    """``last`` returns the committed outputs its context holds (what a declared flow's
    ``${outputs.step}`` reads): those of ``first`` and ``second``, not its own."""

    @start()
    def first(self) -> str:
        return "one"

    @listen(first)
    def second(self, value: str) -> str:
        return value + "+two"

    @listen(second)
    def last(self, _: str) -> dict[str, str]:
        ctx = step_context()
        assert ctx is not None and ctx.outputs is not None
        return {name: str(out) for name, out in sorted(ctx.outputs.items())}
