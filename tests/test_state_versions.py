"""State that evolves across deploys: a stored state is read through the state model as the
code has it now (a new field takes its default, a dropped one is ignored); a state it cannot
read is refused at resume in one line naming the field and the run; a ``@state_upgrade``
hook maps an old state once, and the run records it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from runner import CheckpointConfig, Flow, FlowState, listen, start
from runner.errors import StateUnreadable
from runner.flow.versions import state_upgrade
from runner.settings import reset_settings
from runner.store.redis import RedisProvider


@pytest.fixture
def store(redis_url: str, prefix: str) -> Iterator[RedisProvider]:
    made = RedisProvider(redis_url, prefix=prefix)
    yield made
    made.close()


@pytest.fixture
def version(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Set the deployment's version (``RUNNER_APP_VERSION``) as a deploy would."""

    def set_to(value: str) -> None:
        monkeypatch.setenv("RUNNER_APP_VERSION", value)
        reset_settings()

    yield set_to
    reset_settings()


class Order(FlowState):
    name: str = ""
    total: int = 0
    dropped: str = "gone in v2"


FAIL = {"report": True}


class OrderFlow(Flow[Order]):
    @start()
    def load(self) -> int:
        self.state.name = "Ada Lovelace"
        self.state.total = 3
        return self.state.total

    @listen(load)
    def report(self) -> str:
        if FAIL["report"]:
            raise RuntimeError("report failed")
        return f"{self.state.name}: {self.state.total}"


class OrderWithCurrency(FlowState):
    name: str = ""
    total: int = 0
    currency: str = "EUR"


class OrderFlowV2(Flow[OrderWithCurrency]):
    @start()
    def load(self) -> int:
        return 0

    @listen(load)
    def report(self) -> str:
        return f"{self.state.name}: {self.state.total} {self.state.currency}"


class SplitName(FlowState):
    """A required field with no default cannot be: the flow object could not be made. A
    changed type is what a stored state fails on."""

    first: str = ""
    last: str = ""
    total: dict[str, int] = {}


class OrderFlowRequired(Flow[SplitName]):
    @start()
    def load(self) -> int:
        return 0

    @listen(load)
    def report(self) -> str:
        return f"{self.state.last}, {self.state.first}: {self.state.total}"


UPGRADES: list[dict[str, Any]] = []


class OrderFlowUpgraded(OrderFlowRequired):
    @state_upgrade("v1")
    def split(old: dict[str, Any]) -> dict[str, Any]:
        UPGRADES.append(dict(old))
        first, _, last = old.pop("name").partition(" ")
        return {**old, "first": first, "last": last, "total": {"EUR": old["total"]}}


def failed_on_v1(store: RedisProvider, version: Any) -> str:
    version("v1")
    FAIL["report"] = True
    flow = OrderFlow(checkpoint=CheckpointConfig(provider=store))
    with pytest.raises(RuntimeError):
        flow.kickoff()
    FAIL["report"] = False
    version("v2")
    return flow.state.id


def test_a_new_field_with_a_default_and_a_dropped_field_resume(
    store: RedisProvider, version: Any
) -> None:
    run_id = failed_on_v1(store, version)
    resumed = OrderFlowV2.from_checkpoint(CheckpointConfig(provider=store, restore_from=run_id))
    assert resumed.kickoff() == "Ada Lovelace: 3 EUR"
    latest = store.latest(run_id)
    assert latest is not None and latest.version == "v2"
    assert "dropped" not in latest.state or latest.state["dropped"] == "gone in v2"


def test_a_changed_type_is_refused_at_resume_in_one_line_naming_field_and_run(
    store: RedisProvider, version: Any
) -> None:
    run_id = failed_on_v1(store, version)
    before = [c.id for c in store.history(run_id)]
    with pytest.raises(StateUnreadable) as caught:
        OrderFlowRequired.from_checkpoint(
            CheckpointConfig(provider=store, restore_from=run_id)
        ).kickoff()
    message = str(caught.value)
    assert "\n" not in message
    assert f"run {run_id}" in message and "total" in message and "v1" in message
    assert "@state_upgrade('v1')" in message
    assert caught.value.fields["field"] == "total"
    assert [c.id for c in store.history(run_id)] == before  # nothing written


def test_a_state_upgrade_hook_maps_the_old_state_once_and_is_recorded(
    store: RedisProvider, version: Any
) -> None:
    run_id = failed_on_v1(store, version)
    UPGRADES.clear()
    resumed = OrderFlowUpgraded.from_checkpoint(
        CheckpointConfig(provider=store, restore_from=run_id)
    )
    assert resumed.kickoff() == "Lovelace, Ada: {'EUR': 3}"
    assert len(UPGRADES) == 1 and UPGRADES[0]["name"] == "Ada Lovelace"
    latest = store.latest(run_id)
    assert latest is not None
    assert latest.meta.versions.upgrades == ["v1 -> v2"]
    assert latest.state["first"] == "Ada" and latest.state["last"] == "Lovelace"
