"""Worker side: import the allow-listed flow modules and register their tasks.

Only modules named in ``RUNNER_FLOW_MODULES`` are imported, at start-up; a
message can name a task, never a module. Each flow method becomes the task
``<Flow>.<method>``. A message for a task this worker has not registered (a flow
outside the allow-list) fails its run with :class:`FlowNotAllowed`; a step whose
run names another import path than the registered flow does the same.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import threading
from typing import Any

from celery import Celery, signals

from runner.errors import DefinitionError, FlowImportError
from runner.settings import RunnerSettings, get_settings

from .engine import RECOVER_TASK, Runtime, fail_not_allowed, task_name
from .recovery import recover
from .step import execute

log = logging.getLogger("runner.worker")


def install(
    app: Celery, modules: list[str] | None = None, settings: RunnerSettings | None = None
) -> Runtime:
    """Register the runner's tasks and the allow-listed flows on ``app``."""
    settings = settings or get_settings()
    rt = Runtime.create(app, settings, patient=True)  # a Redis blip must not fail a step
    _register_builtins(app, rt)
    for name in settings.flow_modules if modules is None else modules:
        for flow_cls in flows_in(name):
            register_flow(app, rt, flow_cls)
    _start_recovery_on_ready(app, rt)
    _fail_runs_of_unknown_tasks(app, rt)
    return rt


def flows_in(module_name: str) -> list[type]:
    """The Flow subclasses defined in ``module_name`` (imported here)."""
    from runner.flow.flow import Flow

    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise FlowImportError(
            f"cannot import flow module {module_name}: {exc}", module=module_name
        ) from None
    found = [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj)
        and issubclass(obj, Flow)
        and obj is not Flow
        and obj.__module__ == module.__name__
    ]
    # Crews (objects with ``as_flow``) run as flows of their tasks.
    found += [
        obj.as_flow()
        for obj in vars(module).values()
        if not inspect.isclass(obj) and callable(getattr(obj, "as_flow", None))
    ]
    return found


def register_flow(app: Celery, rt: Runtime, flow_cls: Any) -> list[str]:
    """One task per method of ``flow_cls``; returns the task names."""
    name = flow_cls.flow_name()
    known = rt.flows.get(name)
    if known is not None and known.flow_path() != flow_cls.flow_path():
        raise DefinitionError(
            f"two flows are named {name}: {known.flow_path()} and {flow_cls.flow_path()}; "
            "task names (<Flow>.<method>) must be unique, so rename one (Flow.name)",
            flow=name,
        )
    rt.flows[name] = flow_cls
    names = []
    for method, spec in flow_cls.graph().methods.items():
        limit = spec.time_limit or rt.settings.step_time_limit

        def body(
            task: Any,
            run_id: str,
            activation: str,
            epoch: int = 0,
            attempt: int = 1,
            deployment: str | None = None,
        ) -> dict[str, Any]:
            return execute(rt, task, flow_cls, run_id, activation, epoch, attempt, deployment)

        body.__name__ = body.__qualname__ = f"{name}__{method}"
        app.task(
            name=task_name(name, method),
            bind=True,
            acks_late=True,
            reject_on_worker_lost=True,
            soft_time_limit=limit,
            time_limit=limit * 1.5 + 5 if limit else None,
            max_retries=None,
        )(body)
        names.append(task_name(name, method))
    return names


def _register_builtins(app: Celery, rt: Runtime) -> None:
    @app.task(name=RECOVER_TASK)
    def recover_task() -> dict[str, list[str]]:
        return recover(rt, force=True)


def _start_recovery_on_ready(app: Celery, rt: Runtime) -> None:
    def on_ready(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", app) is not app:
            return
        thread = threading.Thread(target=_recovery_loop, args=(rt,), daemon=True, name="recover")
        thread.start()

    signals.worker_ready.connect(on_ready, weak=False)


def _fail_runs_of_unknown_tasks(app: Celery, rt: Runtime) -> None:
    """A step message for a task this worker lacks fails its run (nothing is imported)."""

    def on_unknown(sender: Any = None, name: str = "", message: Any = None, **_: Any) -> None:
        if getattr(sender, "app", app) is not app:
            return
        try:
            _args, kwargs, *_rest = message.payload
            run_id = kwargs["run_id"]
        except Exception:
            log.warning("unknown task %s with an unexpected body; not a runner step", name)
            return
        latest = rt.coord.read(str(run_id))
        if latest is None or not name.startswith(f"{latest.meta.name}."):
            return  # not one of this deployment's runs, or not its flow's task
        fail_not_allowed(rt, latest.run_id, f"this worker has no task {name}")

    signals.task_unknown.connect(on_unknown, weak=False)


def _recovery_loop(rt: Runtime) -> None:
    stop = threading.Event()
    while not stop.wait(rt.settings.recovery_interval):
        try:
            resent = recover(rt)
            if resent:
                log.warning("recovery re-dispatched %s", resent)
        except Exception:
            log.exception("recovery pass failed; retrying in %ss", rt.settings.recovery_interval)
