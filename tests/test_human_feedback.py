"""``@human_feedback`` in process (CrewAI's semantics): a person reviews a method's output; the
answer becomes a ``HumanFeedbackResult``; with ``emit`` an LLM collapses it to a label whose
listeners run; a provider raising ``HumanFeedbackPending`` pauses the run durably, and
``Flow.from_pending(...).resume(feedback)`` finishes it without running the method again.
Pending feedback is kept by every store and persistence (SQLite, JSON files, Redis)."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from runner import (
    EventListener,
    Flow,
    FlowEvent,
    FlowState,
    HumanFeedbackPending,
    HumanFeedbackResult,
    JsonProvider,
    PendingFeedbackContext,
    RedisFlowPersistence,
    RedisProvider,
    SQLiteFlowPersistence,
    SqliteProvider,
    and_,
    human_feedback,
    listen,
    start,
)
from runner.errors import InvalidFeedback, NoPendingFeedback, NotSerializable
from runner.flow.human_feedback import collapse, match_outcome


class Scripted:
    """A provider answering from a list (the reviewer's answers, in order)."""

    def __init__(self, *answers: str) -> None:
        self.answers = list(answers)
        self.asked: list[PendingFeedbackContext] = []

    def request_feedback(self, context: PendingFeedbackContext, flow: Any) -> str:
        self.asked.append(context)
        return self.answers.pop(0)


class Later:
    """A provider that tells someone elsewhere and lets the run pause."""

    def __init__(self) -> None:
        self.asked: list[PendingFeedbackContext] = []

    def request_feedback(self, context: PendingFeedbackContext, flow: Any) -> str:
        self.asked.append(context)
        raise HumanFeedbackPending(context, callback_info={"ticket": len(self.asked)})


class Keywords:
    """An LLM client (``.call``) that reads "ship it" as approval."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def call(self, prompt: str) -> str:
        self.prompts.append(prompt)
        return "approved" if "ship it" in prompt else "The outcome is: rejected."


def refuse(prompt: str) -> str:
    raise AssertionError(f"the llm was asked: {prompt!r}")


# --- the decorator --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"emit": ["a", "b"]}, "llm is required"),
        ({"default_outcome": "a"}, "requires emit"),
        ({"emit": ["a", "b"], "llm": Keywords(), "default_outcome": "c"}, "must be one of"),
        ({"emit": ["a", "b"], "llm": 42}, "llm must be a client"),  # a name is a str
        ({"emit": "a", "llm": Keywords()}, "emit takes a list"),
        ({"provider": object()}, "provider must have request_feedback"),
    ],
)
def test_the_decorator_refuses_options_that_cannot_work(options: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidFeedback, match=says) as caught:
        human_feedback(message="Review:", **options)
    assert isinstance(caught.value, ValueError)  # as CrewAI raises


def test_the_decorated_method_keeps_its_kind_and_runs_plainly_outside_a_flow_run() -> None:
    @human_feedback(message="Review:")
    async def draft_async(self: Any) -> str:
        return "async"

    @human_feedback(message="Review:", emit=["ok", "no"], llm=Keywords())
    def draft(self: Any, topic: str) -> str:
        return f"draft on {topic}"

    assert asyncio.iscoroutinefunction(draft_async)
    assert draft.__human_feedback_config__.emit == ["ok", "no"]
    assert draft(None, "owls") == "draft on owls"  # no review outside a run


# --- answered at once -----------------------------------------------------------------------


class Publishing(Flow[dict[str, Any]]):
    reviewer: Any = None
    llm: Any = None

    @start()
    def draft(self) -> dict[str, str]:
        self.state["drafts"] = self.state.get("drafts", 0) + 1
        return {"title": "Otters"}

    @listen(draft)
    @human_feedback(message="Publish this?", emit=["approved", "rejected"], llm=Keywords())
    def review(self, draft: dict[str, str]) -> dict[str, str]:
        return {**draft, "body": "they hold hands"}

    @listen("approved")
    def publish(self, reviewed: dict[str, str]) -> str:
        return f"published {reviewed['title']}"

    @listen("rejected")
    def shelve(self) -> str:
        return "shelved"


def reviewed_flow(cls: type[Flow[Any]], **config: Any) -> type[Flow[Any]]:
    """``cls`` with its ``review`` re-decorated with ``config`` (a subclass per test)."""
    body = cls.__dict__["review"].__wrapped__
    decorated = listen("draft")(human_feedback(message="Publish this?", **config)(body))
    return type(cls.__name__, (cls,), {"review": decorated, "__module__": __name__})


def test_the_llm_collapses_an_answer_to_a_label_whose_listeners_run() -> None:
    llm, reviewer = Keywords(), Scripted("ship it, lovely")
    flow_cls = reviewed_flow(
        Publishing, emit=["approved", "rejected"], llm=llm, provider=reviewer, metadata={"ch": 1}
    )
    flow = flow_cls()
    assert flow.kickoff() == "published Otters"
    (context,) = reviewer.asked
    assert (context.method_name, context.message, context.emit) == (
        "review",
        "Publish this?",
        ["approved", "rejected"],
    )
    assert context.method_output == {"title": "Otters", "body": "they hold hands"}
    result = flow.last_human_feedback
    assert isinstance(result, HumanFeedbackResult)
    assert (result.feedback, result.outcome, result.method_name) == (
        "ship it, lovely",
        "approved",
        "review",
    )
    assert result.output == {"title": "Otters", "body": "they hold hands"}
    assert result.metadata == {"ch": 1}
    assert flow.human_feedback_history == [result]
    assert "ship it, lovely" in llm.prompts[0] and "approved, rejected" in llm.prompts[0]
    # The method's real output is kept, not the label.
    assert flow.method_outputs[1] == {"title": "Otters", "body": "they hold hands"}

    reviewer.answers.append("needs work")
    assert flow_cls().kickoff() == "shelved"  # "The outcome is: rejected." names rejected


class Heard(EventListener):
    def __init__(self) -> None:
        self.events: list[FlowEvent] = []

    def on_event(self, event: FlowEvent) -> None:
        self.events.append(event)


def test_a_review_tells_its_request_and_its_answer_to_the_flows_listeners() -> None:
    heard = Heard()
    flow_cls = reviewed_flow(
        Publishing, emit=["approved", "rejected"], llm=Keywords(), provider=Scripted("ship it")
    )
    flow_cls(listeners=[heard]).kickoff()
    told = [(e.type, e.method, e.data) for e in heard.events if "feedback" in e.type]
    assert told == [
        (
            "human_feedback_requested",
            "review",
            {
                "message": "Publish this?",
                "output": {"title": "Otters", "body": "they hold hands"},
                "emit": ["approved", "rejected"],
            },
        ),
        ("human_feedback_received", "review", {"feedback": "ship it", "outcome": "approved"}),
    ]


def test_an_empty_answer_takes_the_default_outcome_without_asking_the_llm() -> None:
    flow_cls = reviewed_flow(
        Publishing,
        emit=["approved", "rejected"],
        llm=refuse,
        default_outcome="rejected",
        provider=Scripted("   "),
    )
    flow = flow_cls()
    assert flow.kickoff() == "shelved"
    assert flow.last_human_feedback is not None
    assert (flow.last_human_feedback.feedback, flow.last_human_feedback.outcome) == (
        "   ",
        "rejected",
    )
    first = reviewed_flow(
        Publishing, emit=["approved", "rejected"], llm=refuse, provider=Scripted("")
    )
    assert first().kickoff() == "published Otters"  # no default: the first label


class Notes(Flow[dict[str, Any]]):
    @start()
    @human_feedback(message="Any notes?", provider=Scripted("tighten it", "cut it"))
    def outline(self) -> str:
        return "outline"

    @listen(outline)
    @human_feedback(message="And now?", provider=Scripted("fine"))
    def draft(self, notes: HumanFeedbackResult) -> str:
        return f"draft after {notes.feedback!r} on {notes.output}"


def test_without_emit_the_result_is_the_output_listeners_receive_and_kickoff_returns() -> None:
    flow = Notes()
    result = flow.kickoff()
    assert isinstance(result, HumanFeedbackResult)
    assert (result.output, result.feedback, result.outcome) == (
        "draft after 'tighten it' on outline",
        "fine",
        None,
    )
    assert [r.method_name for r in flow.human_feedback_history] == ["outline", "draft"]
    assert all(isinstance(o, HumanFeedbackResult) for o in flow.method_outputs)


@pytest.mark.processes
def test_with_no_provider_the_terminal_shows_the_output_and_reads_the_feedback(
    tmp_path: Path,
) -> None:
    script = tmp_path / "console_review.py"
    script.write_text(
        textwrap.dedent(
            """
            from runner import Flow, human_feedback, start

            class Console(Flow):
                @start()
                @human_feedback(message="Is this right?")
                def answer(self):
                    return "forty-two"

            flow = Console()
            result = flow.kickoff()
            print("RESULT", repr(result.feedback), repr(result.output))
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)],
        input="  spot on  \n",
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    shown = done.stdout
    assert "OUTPUT FOR REVIEW" in shown and "forty-two" in shown and "Is this right?" in shown
    assert "RESULT 'spot on' 'forty-two'" in shown


# --- durable waiting in process -------------------------------------------------------------


class Review(FlowState):
    topic: str = ""
    facts: list[str] = []
    verdict: str = ""


RAN: dict[str, list[str]] = {}


class Pipeline(Flow[Review]):
    """gather -> draft -> review (waits for a person) -> publish | revise -> review ..."""

    @start()
    def gather(self) -> list[str]:
        RAN.setdefault(self.state.id, []).append("gather")
        self.state.facts = [f"{self.state.topic} swim"]
        return self.state.facts

    @listen(gather)
    def draft(self, facts: list[str]) -> str:
        RAN[self.state.id].append("draft")
        return f"draft: {', '.join(facts)}"

    @listen(draft, "revise")
    @human_feedback(
        message="Publish it?", emit=["approved", "rejected"], llm=Keywords(), provider=Later()
    )
    def review(self) -> str:
        RAN[self.state.id].append("review")
        self.state.verdict = "in review"  # kept with the pause
        return f"article on {self.state.topic}"

    @listen("approved")
    def publish(self, article: str) -> str:
        RAN[self.state.id].append("publish")
        return f"published {article}"

    @listen("rejected")
    def revise(self) -> str:
        RAN[self.state.id].append("revise")
        self.state.facts = [*self.state.facts, "more"]
        return "revised"


def test_a_pending_review_pauses_and_from_pending_resume_goes_on_without_rerunning(
    tmp_path: Path,
) -> None:
    persistence = SQLiteFlowPersistence(tmp_path / "flows.db")
    flow = Pipeline(persistence=persistence)
    pending = flow.kickoff({"topic": "otters"})
    assert isinstance(pending, HumanFeedbackPending)
    run_id = pending.context.flow_id
    assert pending.callback_info == {"ticket": 1}
    assert pending.context.method_output == "article on otters"
    assert flow.pending_feedback is not None and flow.pending_feedback.method_name == "review"
    assert RAN[run_id] == ["gather", "draft", "review"]

    state, context = persistence.load_pending_feedback(run_id) or ({}, None)
    assert state["verdict"] == "in review" and context is not None
    assert (context.message, context.emit) == ("Publish it?", ["approved", "rejected"])

    again = Pipeline.from_pending(run_id, persistence)
    assert again.state.verdict == "in review"  # the state as the pause kept it
    assert again.resume("no, too short") is not None  # rejected -> revise -> review again
    assert RAN[run_id] == ["gather", "draft", "review", "revise", "review"]
    second = persistence.load_pending_feedback(run_id)
    assert second is not None and second[1].method_name == "review"

    last = Pipeline.from_pending(run_id, persistence)
    assert last.resume("ship it") == "published article on otters"
    assert RAN[run_id] == ["gather", "draft", "review", "revise", "review", "publish"]
    assert [r.outcome for r in last.human_feedback_history] == ["approved"]
    assert persistence.load_pending_feedback(run_id) is None
    with pytest.raises(NoPendingFeedback, match="No pending feedback found"):
        Pipeline.from_pending(run_id, persistence)
    with pytest.raises(NoPendingFeedback, match="no longer waits"):
        again.resume("late")  # that pause was answered already
    with pytest.raises(NoPendingFeedback):
        again.resume("twice")


def test_a_transient_flow_keeps_its_pause_in_the_default_persistence_and_resumes_in_place() -> None:
    flow = Pipeline()
    assert flow.persistence is None
    pending = flow.kickoff({"topic": "seals"})
    assert isinstance(pending, HumanFeedbackPending)
    assert isinstance(flow.persistence, RedisFlowPersistence)  # as CrewAI takes its default
    assert flow.resume("ship it") == "published article on seals"
    assert RAN[pending.context.flow_id] == ["gather", "draft", "review", "publish"]


class Twins(Flow[dict[str, Any]]):
    """Two reviews paused in parallel: the run has one question at a time."""

    @start()
    def begin(self) -> str:
        return "begin"

    @listen(begin)
    @human_feedback(message="left?", provider=Later())
    def left(self) -> str:
        RAN.setdefault(self.state["id"], []).append("left")
        return "L"

    @listen(begin)
    @human_feedback(message="right?", provider=Later())
    def right(self) -> str:
        RAN.setdefault(self.state["id"], []).append("right")
        return "R"

    @listen(and_(left, right))
    def join(self, _: Any = None) -> str:
        return "joined"


def test_reviews_paused_in_parallel_are_asked_in_turn_without_running_a_method_twice(
    tmp_path: Path,
) -> None:
    persistence = SQLiteFlowPersistence(tmp_path / "flows.db")
    first = Twins(persistence=persistence).kickoff()
    assert isinstance(first, HumanFeedbackPending)
    run_id = first.context.flow_id
    second = Twins.from_pending(run_id, persistence).resume("ok")
    assert isinstance(second, HumanFeedbackPending)
    assert {first.context.method_name, second.context.method_name} == {"left", "right"}
    assert second.context.method_output in ("L", "R")
    assert Twins.from_pending(run_id, persistence).resume("ok too") == "joined"
    assert sorted(RAN[run_id]) == ["left", "right"]


def test_a_run_kicked_off_again_by_its_id_is_reviewed_again(tmp_path: Path) -> None:
    persistence = SQLiteFlowPersistence(tmp_path / "flows.db")
    pending = Pipeline(persistence=persistence).kickoff({"topic": "rays"})
    run_id = pending.context.flow_id
    assert (
        Pipeline.from_pending(run_id, persistence).resume("ship it") == "published article on rays"
    )
    # CrewAI's restart by id runs every step again: the review asks again, the answer given
    # to the first run's review#1 is not this one's.
    again = Pipeline(persistence=persistence).kickoff({"id": run_id})
    assert isinstance(again, HumanFeedbackPending)
    assert RAN[run_id].count("review") == 2


def test_resume_async_answers_and_resume_refuses_a_running_loop(tmp_path: Path) -> None:
    persistence = SQLiteFlowPersistence(tmp_path / "flows.db")
    pending = Pipeline(persistence=persistence).kickoff({"topic": "eels"})
    flow = Pipeline.from_pending(pending.context.flow_id, persistence)

    async def answer() -> Any:
        with pytest.raises(RuntimeError, match="resume_async"):
            flow.resume("ship it")
        return await flow.resume_async("ship it")

    assert asyncio.run(answer()) == "published article on eels"
    with pytest.raises(NoPendingFeedback, match="waits for no review"):
        Pipeline().resume("nothing to answer")


# --- pending feedback on every store --------------------------------------------------------


def make_store(tmp_path: Path, kind: str) -> Any:
    prefix = f"t-{uuid.uuid4().hex[:8]}"
    return {
        "sqlite": lambda: SqliteProvider(tmp_path / "runs.db"),
        "json": lambda: JsonProvider(tmp_path / "runs"),
        "redis": lambda: RedisProvider(prefix=prefix),
        "sqlite-persistence": lambda: SQLiteFlowPersistence(tmp_path / "flows.db"),
        "redis-persistence": lambda: RedisFlowPersistence(prefix=prefix),
    }[kind]()


@pytest.mark.parametrize(
    "kind", ["sqlite", "json", "redis", "sqlite-persistence", "redis-persistence"]
)
def test_every_store_saves_loads_replaces_and_clears_pending_feedback(
    tmp_path: Path, kind: str
) -> None:
    store = make_store(tmp_path, kind)
    run_id = f"run-{uuid.uuid4().hex[:6]}"
    assert store.load_pending_feedback(run_id) is None
    store.clear_pending_feedback(run_id)  # nothing to clear: nothing happens
    first = PendingFeedbackContext(run_id, "m:F", "review", {"v": 1}, "Look:", ["ok", "no"])
    store.save_pending_feedback(run_id, first, {"id": run_id, "n": 1})
    state, context = store.load_pending_feedback(run_id)
    assert state == {"id": run_id, "n": 1}
    assert (context.method_name, context.method_output, context.emit) == (
        "review",
        {"v": 1},
        ["ok", "no"],
    )
    assert context.to_dict() == PendingFeedbackContext.from_dict(context.to_dict()).to_dict()
    second = PendingFeedbackContext(run_id, "m:F", "review", "v2", "Again:")
    store.save_pending_feedback(run_id, second, {"id": run_id, "n": 2})
    state, context = store.load_pending_feedback(run_id)
    assert (state["n"], context.method_output, context.message) == (2, "v2", "Again:")
    store.clear_pending_feedback(run_id)
    assert store.load_pending_feedback(run_id) is None
    store.close()


@pytest.mark.parametrize("kind", ["sqlite-persistence", "redis-persistence"])
def test_a_pending_state_that_is_no_json_is_refused_as_a_checkpoint_s_is_and_nothing_is_kept(
    tmp_path: Path, kind: str
) -> None:
    """A state is restored from what is saved, so no value of it is kept as its ``str``: the
    same one error a checkpoint of that state gives (``save_state``)."""
    store = make_store(tmp_path, kind)
    run_id = f"run-{uuid.uuid4().hex[:6]}"
    context = PendingFeedbackContext(run_id, "m:F", "review", "draft", "Look:")
    state = {"id": run_id, "lock": object()}
    with pytest.raises(NotSerializable, match=f"state of flow {run_id} is not JSON") as pending:
        store.save_pending_feedback(run_id, context, state)
    with pytest.raises(NotSerializable) as saved:
        store.save_state(run_id, "review", state)
    assert str(pending.value) == str(saved.value)
    assert store.load_pending_feedback(run_id) is None
    assert store.load_state(run_id) is None
    store.close()


class Manual(Flow[dict[str, Any]]):
    @start()
    @human_feedback(message="Review:")
    def generate(self) -> str:
        raise AssertionError("a method whose output was under review never runs again")

    @listen(generate)
    def process(self, result: HumanFeedbackResult) -> str:
        return f"processed {result.output} with {result.feedback!r}"


def test_a_pending_review_a_provider_saved_itself_is_answered_from_pending(tmp_path: Path) -> None:
    persistence = SQLiteFlowPersistence(tmp_path / "flows.db")
    context = PendingFeedbackContext("manual-1", "x:Manual", "generate", "content", "Review:")
    persistence.save_pending_feedback("manual-1", context, {"id": "manual-1", "seen": True})
    flow = Manual.from_pending("manual-1", persistence)
    assert flow.state == {"id": "manual-1", "seen": True}
    assert flow.resume("looks good") == "processed content with 'looks good'"
    assert persistence.load_pending_feedback("manual-1") is None


# --- collapsing an answer to a label --------------------------------------------------------


def test_a_reply_is_matched_as_it_is_as_json_then_by_the_first_label_it_names() -> None:
    labels = ["needs_changes", "approved"]
    assert match_outcome(" Approved. ", labels) == "approved"
    assert match_outcome(json.dumps({"outcome": "needs_changes"}), labels) == "needs_changes"
    assert match_outcome("I'd say approved overall", labels) == "approved"
    assert match_outcome("no idea", labels) is None


def test_a_reply_naming_no_label_or_a_failing_llm_gives_the_first_label_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "runner.flow")
    labels = ["needs_changes", "approved"]
    assert collapse("meh", labels, lambda prompt: "something else") == "needs_changes"
    assert collapse("meh", labels, refuse) == "needs_changes"
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2
    assert said[0].startswith("the llm's reply 'something else' names none of")
    assert said[1].startswith("collapsing feedback to ['needs_changes', 'approved'] failed")
