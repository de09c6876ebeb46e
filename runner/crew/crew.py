"""``Crew``: ordered tasks done by agents (CrewAI's sequential process).

A crew runs as a flow of its tasks (:mod:`runner.crew.compile`): ``kickoff`` in this
process, ``submit`` on Celery workers, each task one Celery task and one checkpoint.

Workers and ``resume`` import a crew by path ``module:variable``: a crew that is to run on
workers must be a module-level variable of an allow-listed module. Its name defaults to
that variable's name (CrewAI's default, ``"crew"``, when it is not one).
"""

from __future__ import annotations

import asyncio
import copy
import keyword
import sys
import threading
import uuid
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from runner.checkpointing import CheckpointConfig, StoreSink, load_restore_point, resolve_config
from runner.crew.agent import Agent
from runner.crew.compile import CrewFlow, compile_crew
from runner.crew.task import CrewOutput, Task, TaskOutput
from runner.errors import DefinitionError, FlowImportError, InvalidInputs
from runner.flow.children import ChildRun, child_run_id
from runner.flow.context import step_context
from runner.flow.flow import checkpoint_store, state_json
from runner.flow.loading import load_flow
from runner.flow.local import check_graph
from runner.store.models import Checkpoint, RunStatus

if TYPE_CHECKING:
    from runner.crew.handle import CrewRunHandle
    from runner.distributed.engine import Runtime

DEFAULT_NAME = "crew"
_RESERVED_INPUTS = frozenset({"inputs", "outputs"})


class Process(StrEnum):
    """How a crew orders its tasks; only ``sequential`` is supported."""

    sequential = "sequential"
    hierarchical = "hierarchical"


class _ClassOrInstance:
    """A method that is one thing on the class and another on an instance (``Crew.fork``:
    CrewAI's ``Crew.fork(config, branch=...)`` on the class, a fork on the workers of a
    checkpoint of this crew on an instance)."""

    def __init__(self, on_class: Any, on_instance: Any) -> None:
        self.on_class = on_class
        self.on_instance = on_instance
        self.__doc__ = on_instance.__doc__

    def __get__(self, obj: Any, owner: type) -> Any:
        if obj is None:
            return self.on_class.__get__(None, owner)
        return self.on_instance.__get__(obj, owner)


class Crew:
    """Agents doing tasks in order; each task sees the outputs of the tasks before it."""

    def __init__(
        self,
        agents: list[Agent] | None = None,
        tasks: list[Task] | None = None,
        *,
        name: str | None = None,
        process: Process | str = Process.sequential,
        checkpoint: CheckpointConfig | bool | None = None,
        verbose: bool = False,
    ) -> None:
        self.agents = list(agents or [])
        """The crew's agents (tasks name their own)."""
        self.tasks = list(tasks or [])
        """The tasks, in the order they run."""
        self.checkpoint = checkpoint
        """``None``: off unless an agent or task turns it on; ``True`` defaults; a config."""
        self.verbose = verbose
        """Accepted for CrewAI compatibility; events are the runner's way to observe runs."""
        self.module: str = sys._getframe(1).f_globals.get("__name__", "__main__")
        """The module that built the crew; its flow class lives there."""
        self._name = name
        self._restore: CheckpointConfig | None = None
        """Set by :meth:`from_checkpoint` / CrewAI's ``Crew.fork``: the next kickoff restores it."""
        self._branch: str | None = None
        """With ``_restore``: the next kickoff forks it into a new run on this branch."""
        self._variable: str | None = None
        self._flow: type[CrewFlow] | None = None
        self._lock = threading.Lock()
        _check(self, Process(process))

    def __repr__(self) -> str:
        return f"Crew(name={self.name!r}, tasks={[t.name for t in self.tasks]})"

    # -- naming ----------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The name given, else the module variable holding the crew, else ``"crew"``."""
        return self._name or self.variable() or DEFAULT_NAME

    def variable(self) -> str | None:
        """The module-level variable of :attr:`module` that holds this crew, if any."""
        if self._variable is None:
            module = sys.modules.get(self.module)
            names = [k for k, v in vars(module).items() if v is self] if module else []
            if names:
                self._variable = self._name if self._name in names else names[0]
        return self._variable

    def flow_path(self) -> str:
        """``module:variable``, the path workers and ``resume`` load the crew by."""
        return f"{self.module}:{self.variable() or f'<crew {self.name} not at module level>'}"

    def as_flow(self) -> type[CrewFlow]:
        """The flow class running this crew's tasks (made once, then cached)."""
        with self._lock:
            if self._flow is None:
                self._flow = compile_crew(self)
            return self._flow

    # -- checkpoints -------------------------------------------------------------------------

    def effective_checkpoint(
        self, task: Task, default: CheckpointConfig | None = None
    ) -> CheckpointConfig | None:
        """The checkpoint config in force for ``task`` (CrewAI's inheritance).

        The task's value, else its agent's, else the crew's: ``None`` inherits, ``True`` is
        the default config, ``False`` opts out (``None`` is returned). ``default`` when all
        three are ``None``.
        """
        agent = task.agent.checkpoint if task.agent is not None else None
        for value in (task.checkpoint, agent, self.checkpoint):
            if value is not None:
                return resolve_config(value)
        return default

    # -- running -------------------------------------------------------------------------------

    def kickoff(
        self,
        inputs: dict[str, Any] | None = None,
        from_checkpoint: CheckpointConfig | str | None = None,
        restore_from_state_id: str | None = None,
    ) -> CrewOutput:
        """Run the crew in this process; resume with ``from_checkpoint`` (a config, a
        checkpoint file or id), or what :meth:`from_checkpoint` / ``Crew.fork`` set up."""
        inputs = dict(inputs or {})
        if from_checkpoint is None and self._restore is not None:
            restore, branch, self._restore, self._branch = self._restore, self._branch, None, None
            if branch is not None:
                return self._fork_run(restore, branch, inputs)
            from_checkpoint = restore
        if from_checkpoint is None and restore_from_state_id is None and "id" not in inputs:
            self.check_inputs(inputs)
        override = from_checkpoint if isinstance(from_checkpoint, CheckpointConfig) else None
        return self._kickoff(inputs, override, from_checkpoint, restore_from_state_id)

    def _kickoff(
        self,
        inputs: dict[str, Any],
        checkpoint: CheckpointConfig | None,
        from_checkpoint: CheckpointConfig | str | None = None,
        restore_from_state_id: str | None = None,
    ) -> CrewOutput:
        flow = self.as_flow()(checkpoint=checkpoint)
        flow.kickoff(
            inputs=inputs,
            from_checkpoint=from_checkpoint,
            restore_from_state_id=restore_from_state_id,
        )
        return self.output(state_json(flow))

    async def kickoff_async(
        self,
        inputs: dict[str, Any] | None = None,
        from_checkpoint: CheckpointConfig | str | None = None,
        restore_from_state_id: str | None = None,
    ) -> CrewOutput:
        """``kickoff`` without blocking the event loop."""
        return await asyncio.to_thread(self.kickoff, inputs, from_checkpoint, restore_from_state_id)

    akickoff = kickoff_async

    @classmethod
    def from_checkpoint(
        cls, config: CheckpointConfig | str | Path, *, crew: Crew | None = None
    ) -> Crew:
        """The crew a checkpoint was written by, set to resume it on its next ``kickoff``
        (CrewAI's ``Crew.from_checkpoint``): completed tasks are skipped.

        The crew is loaded by the import path the checkpoint records, which only a crew
        held by a module-level variable has; one built inside a function (a factory, as
        CrewAI's ``@CrewBase`` classes build theirs) is passed as ``crew``, built the same
        way again. Either way a copy is returned; the crew given is left as it is.
        """
        restore = config if isinstance(config, CheckpointConfig) else _config_for(config)
        ckpt = load_restore_point(StoreSink(restore.store(), frozenset()), restore)
        if crew is None:
            source = _crew_of(ckpt)
        elif isinstance(crew, Crew):
            check_graph(crew.as_flow().graph(), ckpt)
            source = crew
        else:
            raise DefinitionError(f"from_checkpoint takes crew=a Crew, not {crew!r}")
        restored = copy.copy(source)
        restored._restore, restored._branch = restore, None
        return restored

    @classmethod
    def _fork_of(
        cls,
        config: CheckpointConfig | str | Path,
        branch: str | None = None,
        *,
        crew: Crew | None = None,
    ) -> Crew:
        """CrewAI's ``Crew.fork(config, branch=...)``: the crew a checkpoint was written by
        (or ``crew``, as for :meth:`from_checkpoint`), set so its next ``kickoff`` starts a
        new run (a fork on ``branch``) from the checkpoint; the source run is left as it is."""
        crew = cls.from_checkpoint(config, crew=crew)
        crew._branch = branch if branch is not None else f"fork/{uuid.uuid4().hex[:8]}"
        return crew

    def _fork_run(
        self, config: CheckpointConfig, branch: str, inputs: dict[str, Any]
    ) -> CrewOutput:
        store = config.store()
        source = load_restore_point(StoreSink(store, frozenset()), config)
        started = store.fork(source.id, new_run_id=str(uuid.uuid4()), branch=branch)
        own = CheckpointConfig(
            provider=store,
            on_events=config.on_events,
            max_checkpoints=config.max_checkpoints,
        )
        return self._kickoff(inputs, own, from_checkpoint=started.id)

    def submit(
        self, inputs: dict[str, Any] | None = None, *, rt: Runtime | None = None, **options: Any
    ) -> CrewRunHandle:
        """Run the crew on Celery workers; each task is the Celery task ``<crew>.<task>``.
        ``options`` are :func:`runner.submit`'s (``id``, ``if_exists``)."""
        from runner.crew.handle import CrewRunHandle
        from runner.distributed.client import submit

        self.require_importable()
        inputs = dict(inputs or {})
        self.check_inputs(inputs)
        handle = submit(self.as_flow(), inputs, rt=rt, **options)
        return CrewRunHandle(handle.run_id, handle.rt, crew=self)

    def resume(
        self,
        run_id: str,
        from_checkpoint: str | None = None,
        inputs: dict[str, Any] | None = None,
        *,
        rt: Runtime | None = None,
    ) -> CrewRunHandle:
        """Continue a crew run on the workers at its first task not completed."""
        from runner.crew.handle import CrewRunHandle
        from runner.distributed import control

        handle = control.resume(run_id, from_checkpoint, inputs, rt=rt)
        return CrewRunHandle(handle.run_id, handle.rt, crew=self)

    def _fork_on_workers(
        self,
        ref: str,
        outputs: Mapping[str, Any] | None = None,
        rerun: list[str] | None = None,
        *,
        inputs: dict[str, Any] | None = None,
        branch: str | None = None,
        run_id: str | None = None,
        rt: Runtime | None = None,
    ) -> CrewRunHandle:
        """A new run from checkpoint (or run) ``ref`` on the workers, with edited outputs.

        ``outputs`` maps task names to replacement outputs (a string is the new ``raw``);
        every task after the first edited one re-runs with the new context, as do
        ``rerun`` tasks and everything after them. ``inputs`` replace kickoff inputs.
        """
        from runner.crew.handle import CrewRunHandle
        from runner.distributed import control

        rt = rt or control.runtime()
        source = control.find_checkpoint(rt, ref)
        edits: dict[str, Any] = {}
        again = list(rerun or [])
        if outputs:
            edits["outputs"] = self._edited_outputs(source.state.get("outputs", {}), outputs)
            later = self._after(min(self._index(name) for name in outputs))
            again += later[:1]
        if inputs:
            edits["inputs"] = {**source.state.get("inputs", {}), **inputs}
        handle = control.fork(
            source.id, set=edits, rerun=again, branch=branch, run_id=run_id, rt=rt
        )
        return CrewRunHandle(handle.run_id, handle.rt, crew=self)

    fork = _ClassOrInstance(_fork_of, _fork_on_workers)

    # -- results and checks ----------------------------------------------------------------

    # -- as a child run of a flow method ---------------------------------------------------

    def run_as_child(self, flow: Any, inputs: dict[str, Any] | None = None) -> Any:
        """Run as a child of the flow method calling this (``Flow.run_crew``).

        In process the crew runs inline and its :class:`CrewOutput` is returned; the child
        run's id is derived from the parent run and the method's activation and its
        checkpoints go to the crew's store (else the parent flow's), so a resumed parent
        resumes the child at its first unfinished task. On workers this returns a
        :class:`~runner.flow.children.ChildRun` marker: the engine starts the child and
        commits the method with its output when it ends, so no worker waits on it.
        """
        inputs = dict(inputs or {})
        ctx = step_context()
        activation = ctx.activation if ctx is not None and ctx.runs(flow) else None
        if activation is not None and type(flow).graph().spec(activation.method).is_router:
            raise DefinitionError(
                f"{activation.method} is a router: run the crew in a @listen method and "
                "route on its output",
                method=activation.method,
            )
        if ctx is not None and ctx.on_worker:
            self.require_importable()
            self.check_inputs(inputs)
            return ChildRun(flow=self.flow_path(), name=self.name, inputs=inputs)
        config = self._child_config(flow)
        if activation is None or config is None:
            return self.kickoff(inputs)  # nowhere to resume from: a plain inline run
        child_id = child_run_id(flow.flow_id, activation.id)
        latest = config.store().latest(child_id)
        if latest is None:
            self.check_inputs(inputs)
            return self._kickoff({**inputs, "id": child_id}, config)
        if latest.status is RunStatus.SUCCEEDED:
            return self.output(latest.state)
        return self._kickoff(inputs, config, from_checkpoint=latest.id)

    def _child_config(self, flow: Any) -> CheckpointConfig | None:
        """The crew's own checkpoint config, else the parent flow's store."""
        own = self.as_flow().checkpoint
        if isinstance(own, CheckpointConfig):
            return own
        store = checkpoint_store(flow)
        return None if store is None else CheckpointConfig(provider=store)

    def output(self, state: Mapping[str, Any]) -> CrewOutput:
        """The :class:`CrewOutput` of a run's state (finished tasks only)."""
        done = state.get("outputs") or {}
        outs = [TaskOutput.load(done[t.name], t) for t in self.tasks if t.name in done]
        if not outs:
            return CrewOutput()
        last = outs[-1]
        return CrewOutput(
            raw=last.raw, pydantic=last.pydantic, json_dict=last.json_dict, tasks_output=outs
        )

    def check_inputs(self, inputs: Mapping[str, Any]) -> None:
        """Raise :class:`InvalidInputs` if a task placeholder has no input."""
        reserved = sorted(_RESERVED_INPUTS & set(inputs))
        if reserved:
            raise InvalidInputs(
                f"crew {self.name!r}: {', '.join(reserved)} cannot be used as input names",
                crew=self.name,
            )
        needed = set().union(*(t.placeholders() for t in self.tasks))
        missing = sorted(needed - set(inputs))
        if missing:
            raise InvalidInputs(
                f"crew {self.name!r} needs input(s) {', '.join(missing)}",
                crew=self.name,
                missing=missing,
            )

    def require_importable(self) -> None:
        """Raise unless workers can load this crew by :meth:`flow_path`."""
        if self.variable() is None:
            raise DefinitionError(
                f"crew {self.name!r} is not a module-level variable of {self.module}; "
                "workers load crews by path module:variable",
                crew=self.name,
            )

    def _index(self, name: str) -> int:
        for i, task in enumerate(self.tasks):
            if task.name == name:
                return i
        raise DefinitionError(f"crew {self.name!r} has no task {name!r}", crew=self.name)

    def _after(self, index: int) -> list[str]:
        return [t.name for t in self.tasks[index + 1 :]]

    def _edited_outputs(
        self, current: Mapping[str, Any], edits: Mapping[str, Any]
    ) -> dict[str, Any]:
        """``current`` outputs with ``edits`` applied: a string replaces the result text, a
        model or dict the structured result, a :class:`TaskOutput` the whole output."""
        merged = dict(current)
        for name, value in edits.items():
            task = self.tasks[self._index(name)]
            if isinstance(value, TaskOutput):
                merged[name] = value.dump()
                continue
            if isinstance(value, str):
                fields: dict[str, Any] = {"raw": value, "json_dict": None, "pydantic": None}
            elif isinstance(value, BaseModel):
                made = task.make_output(value, "", "", "").dump()
                fields = {k: made[k] for k in ("raw", "json_dict", "pydantic")}
            else:
                fields = dict(value)
            merged[name] = TaskOutput.load({**merged.get(name, {}), **fields}, task).dump()
        return merged


def _config_for(ref: str | Path) -> CheckpointConfig:
    """A restore config for a checkpoint file, a SQLite ``<file>#<id>`` or an id (whose
    store is then the default location's)."""
    return CheckpointConfig(restore_from=str(ref))


def _crew_of(ckpt: Checkpoint) -> Crew:
    """The crew that wrote ``ckpt``, loaded by its import path."""
    try:
        flow = load_flow(ckpt.flow or "")
    except FlowImportError as exc:
        raise FlowImportError(
            f"checkpoint {ckpt.id} was written by {ckpt.flow}, which cannot be loaded by "
            "path (only a crew held by a module-level variable can be): pass the crew, built "
            "again, as Crew.from_checkpoint(config, crew=make_crew())",
            checkpoint_id=ckpt.id,
            path=ckpt.flow,
        ) from exc
    crew = getattr(flow, "crew", None)
    if not isinstance(crew, Crew):
        raise DefinitionError(
            f"checkpoint {ckpt.id} was written by {ckpt.flow}, which is not a crew",
            checkpoint_id=ckpt.id,
        )
    return crew


def _check(crew: Crew, process: Process) -> None:
    """Refuse a crew that cannot run: wrong process, no tasks, bad names or context."""
    if process is not Process.sequential:
        raise DefinitionError(
            f"process {process.value!r} is not supported; crews run sequentially",
            process=process.value,
        )
    if not crew.tasks:
        raise DefinitionError("a crew needs at least one task")
    reserved = set(dir(CrewFlow))
    seen: dict[str, Task] = {}
    for task in crew.tasks:
        if not isinstance(task, Task):
            raise DefinitionError(f"crew tasks must be Task objects, not {task!r}")
        name = task.name
        if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_"):
            raise DefinitionError(
                f"task name {name!r} must be a Python identifier not starting with '_'",
                task=name,
            )
        if name in reserved:
            raise DefinitionError(f"task name {name!r} is reserved; pick another name=", task=name)
        if name in seen:
            raise DefinitionError(
                f"two tasks are named {name!r}; task names must be unique (give name=...)",
                task=name,
            )
        if task.fn is None and (task.agent is None or task.agent.llm is None):
            raise DefinitionError(
                f"task {name!r} has no fn and no agent with an llm to do it", task=name
            )
        for earlier in task.context or ():
            if earlier not in seen.values():
                raise DefinitionError(
                    f"task {name!r}: context task {earlier.name!r} does not run before it",
                    task=name,
                )
        seen[name] = task
