"""``--input``/``--set`` text becomes state as the flow's model types it: a ``str`` field keeps
text that JSON would read as a number (an id such as ``12345678``, a zip code ``02134``)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from pydantic import BaseModel

from runner.flow.state import values_from_text
from runner.store.models import RunStatus
from tests.flows.cli import gate_key
from tests.test_cli import GATED, Cli, cli  # noqa: F401  (fixture)


class Form(BaseModel):
    code: str = ""
    note: str | None = None
    count: int = 0
    tags: list[str] = []
    either: int | str = 0


def test_a_str_field_keeps_its_text_and_other_fields_read_json() -> None:
    values = values_from_text(
        Form,
        {
            "code": "02134",
            "note": "1e5",
            "count": "3",
            "tags": '["a", "b"]',
            "either": "7",
            "extra": "true",
        },
    )
    assert values == {
        "code": "02134",
        "note": "1e5",
        "count": 3,
        "tags": ["a", "b"],
        "either": 7,  # a union that is not only str reads JSON, as before
        "extra": True,  # not a field: JSON as before
    }
    # A JSON string literal still reads as the string, and text that is no JSON stays text.
    assert values_from_text(Form, {"code": '"x y"', "note": "plain"}) == {
        "code": "x y",
        "note": "plain",
    }
    # null is None for a field that takes None, and text for one that does not.
    assert values_from_text(Form, {"note": "null", "code": "null"}) == {
        "note": None,
        "code": "null",
    }


def test_dict_state_reads_each_value_as_json_when_it_parses() -> None:
    assert values_from_text(None, {"a": "12", "b": "null", "c": "text"}) == {
        "a": 12,
        "b": None,
        "c": "text",
    }


@pytest.fixture
def digits(redis_client: redis.Redis) -> Iterator[list[str]]:
    """Tags made only of digits (seeded), and their counter keys removed after."""
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    rng = random.Random(seed)
    tags = [f"{rng.randrange(10**7, 10**8)}" for _ in range(3)]
    yield tags
    for tag in tags:
        keys = list(redis_client.scan_iter(f"cli-test:{tag}:*"))
        if keys:
            redis_client.delete(*keys)


def test_submit_fork_and_resume_keep_a_digit_only_str_input_a_string(
    cli: Cli,  # noqa: F811
    rt: Any,
    redis_client: redis.Redis,
    digits: list[str],
) -> None:
    first, forked, resumed = digits
    # The gate of the first tag stays shut: the run fails at `check`, with its state stored.
    failed = cli("submit", GATED, "--input", f"tag={first}", "--input", "x=2", "--wait")
    assert failed.exit_code == 1, (failed.stdout, failed.stderr)
    run_id = failed.stdout.split()[0]
    assert rt.store.latest(run_id).state["tag"] == first
    assert rt.store.latest(run_id).state["x"] == 2

    fork = cli.ok("fork", run_id, "--set", f"tag={forked}").stdout.split()[0]
    assert rt.store.history(fork, limit=1000)[-1].state["tag"] == forked

    redis_client.set(gate_key(resumed), 1)
    cli.ok("resume", run_id, "--input", f"tag={resumed}", "--wait")
    assert rt.store.run(run_id).status is RunStatus.SUCCEEDED
    assert rt.store.latest(run_id).state["tag"] == resumed
