"""What the retention and archive tests share: a deployment of a test's own (no workers), runs
kicked off into it in process, and the CLI on it."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from typing import Any

from runner import CheckpointConfig
from runner.distributed.app import make_app
from runner.distributed.engine import Runtime
from runner.settings import RunnerSettings
from tests import cli_support
from tests.flows.retained import Report


@contextlib.contextmanager
def deployment(redis_url: str, prefix: str, **more: Any) -> Iterator[Runtime]:
    """A runtime on a prefix of its own, with no workers (no pass but the test's); ``more``
    settings (``encryption_keys=``)."""
    settings = RunnerSettings(prefix=prefix, redis_url=redis_url, **more)
    rt = Runtime.create(make_app(settings), settings)
    try:
        yield rt
    finally:
        rt.close()


def policy(rt: Runtime, retention: str, **more: Any) -> RunnerSettings:
    """The deployment's settings with this ``RUNNER_RETENTION``."""
    return rt.settings.model_copy(update={"retention": retention, **more})


def kickoff(rt: Runtime, flow_cls: Any = Report, **inputs: Any) -> str:
    """Run ``flow_cls`` in this process into the deployment's Redis; its run id."""
    flow = flow_cls(checkpoint=CheckpointConfig(provider=rt.store, on_events=["*"]))
    with contextlib.suppress(RuntimeError):  # told to fail: the run is failed
        flow.kickoff(inputs=inputs)
    return str(flow.state.id)


def cli(rt: Runtime, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``runner ARGS`` on the test's deployment (in this process: :mod:`tests.cli_support`)."""
    environ = {
        "RUNNER_REDIS_URL": str(rt.store.url),
        "RUNNER_PREFIX": rt.settings.prefix,
        "RUNNER_FLOW_MODULES": "tests.flows.retained",
        "COLUMNS": "220",
        **env,
    }
    return cli_support.run(*args, env=environ)
