"""The flow authoring model and its pure logic.

* :mod:`runner.flow.conditions` -- ``or_`` / ``and_`` trigger conditions.
* :mod:`runner.flow.decorators` -- ``@start``, ``@listen``, ``@router``.
* :mod:`runner.flow.graph` -- the graph compiled (and validated) from a Flow class.
* :mod:`runner.flow.orchestrator` -- "given what finished, what is ready", over an
  :class:`~runner.flow.orchestrator.ExecutionRecord` stored in checkpoints.
* :mod:`runner.flow.state` -- ``FlowState``, JSON dumping, and merging the changes of
  parallel branches with reducers.

Everything here is pure: no Redis, no Celery, no clock.
"""
