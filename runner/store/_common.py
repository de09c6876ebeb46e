"""Record rules shared by the providers, so every backend derives the same metadata.

A provider moves bytes; these helpers decide what a committed checkpoint means for
the run's :class:`RunInfo`, what a fork's first checkpoint looks like, and how a
snapshot is encoded and decoded (with the store's errors, never pydantic's).
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import ValidationError
from pydantic_core import PydanticSerializationError

from runner import ids
from runner.errors import (
    CommitConflict,
    CorruptCheckpoint,
    NotSerializable,
    StaleAttempt,
    StoreError,
)
from runner.store import codec as codecs
from runner.store.models import Checkpoint, Lineage, RunInfo, RunStatus

FORKED_EVENT = "forked"
"""Event of the first checkpoint of a run made by :meth:`CheckpointStore.fork`."""

_FIXED_RUN_FIELDS = frozenset({"run_id"})


def resolve_max(default: int | None) -> int:
    """A provider's history length: the given value, else the settings' ``max_checkpoints``."""
    if default is not None:
        return max(default, 0)
    from runner.settings import get_settings

    return get_settings().max_checkpoints


SERIALIZATION_ERRORS = (PydanticSerializationError, TypeError, ValueError)
"""What encoding a checkpoint with a value JSON cannot hold raises."""


def resolve_codec(given: codecs.Codec | None) -> codecs.Codec | None:
    """A provider's codec: the given one, else ``RUNNER_ENCRYPTION_KEYS``'s (``None``: off)."""
    if given is not None:
        return given
    from runner.settings import get_settings

    return codecs.of_settings(get_settings())


def encode(checkpoint: Checkpoint, codec: codecs.Codec | None = None) -> str:
    """The checkpoint as JSON text; :class:`NotSerializable` if a value cannot be written.

    With a ``codec``, its payloads (:data:`~runner.store.codec.PAYLOAD`) are taken out and
    put back sealed, as ``"sealed":"enc:..."``, bound to its run and id: the form the Redis
    store keeps a snapshot in, so every store seals the same parts the same way.
    """
    try:
        if codec is None:
            return checkpoint.model_dump_json()
        clear = checkpoint.model_dump_json(exclude=codecs.PAYLOAD)
        secret = checkpoint.model_dump_json(include=codecs.PAYLOAD)
    except SERIALIZATION_ERRORS as exc:
        raise not_serializable(checkpoint, exc) from None
    where = codecs.snapshot_context(checkpoint.run_id, checkpoint.id)
    return f'{clear[:-1]},"sealed":"{codec.seal(secret.encode(), where)}"}}'


def encode_info(info: RunInfo, codec: codecs.Codec | None = None) -> str:
    """Run metadata as JSON text, its payload (the error's text) sealed by ``codec``."""
    return sealed_info(info, codec).model_dump_json()


def sealed_info(info: RunInfo, codec: codecs.Codec | None) -> RunInfo:
    """``info`` with its error's text sealed by ``codec`` (as it is if none)."""
    if codec is None or not info.error:
        return info
    where = codecs.field_context(info.run_id, "error")
    return info.model_copy(update={"error": codec.seal(info.error.encode(), where)})


def not_serializable(checkpoint: Checkpoint, exc: Exception) -> NotSerializable:
    """The :class:`NotSerializable` of a checkpoint holding a value JSON cannot hold."""
    return NotSerializable(
        f"checkpoint {checkpoint.id} of run {checkpoint.run_id} is not JSON: {exc}",
        checkpoint_id=checkpoint.id,
        run_id=checkpoint.run_id,
    )


def decode(
    data: str | bytes | dict[str, Any],
    checkpoint_id: str,
    where: str,
    codec: codecs.Codec | None = None,
    run_id: str | None = None,
) -> Checkpoint:
    """Parse a stored snapshot (or its parsed JSON); :class:`CorruptCheckpoint` naming the id
    if it is unreadable. A sealed one (see :func:`encode`) is opened with ``codec``
    (:class:`~runner.errors.EncryptionKeyError` naming the key if it cannot be); ``run_id``
    is the run it is stored under, if the store files it by run."""
    try:
        if isinstance(data, dict):
            return Checkpoint.model_validate(data)
        what = f"checkpoint {checkpoint_id}{'' if run_id is None else f' of run {run_id}'}"
        opened = codecs.open_snapshot(codec, data, run_id, f"{what} in {where}")
        if opened is not None:
            return Checkpoint.model_validate(opened)
        return Checkpoint.model_validate_json(data)
    except (ValidationError, ValueError, UnicodeDecodeError) as exc:
        reason = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        raise CorruptCheckpoint(
            f"checkpoint {checkpoint_id} in {where} cannot be decoded: {reason}",
            checkpoint_id=checkpoint_id,
        ) from None


def decode_info(
    data: str | bytes | dict[str, Any],
    run_id: str,
    where: str,
    codec: codecs.Codec | None = None,
) -> RunInfo:
    """Parse stored run metadata; :class:`StoreError` naming the run if it is unreadable.
    A sealed error text (see :func:`encode_info`) is opened with ``codec``."""
    try:
        if isinstance(data, dict):
            info = RunInfo.model_validate(data)
        else:
            info = RunInfo.model_validate_json(data)
    except ValidationError as exc:
        raise StoreError(
            f"metadata of run {run_id} in {where} cannot be decoded: {exc.errors()[0]['msg']}",
            run_id=run_id,
        ) from None
    if info.error and codecs.is_sealed(info.error):
        context = codecs.field_context(info.run_id, "error")
        what = f"the error of run {info.run_id} in {where}"
        info.error = codecs.open_value(codec, info.error, context, what).decode()
    return info


def run_info_after(
    checkpoint: Checkpoint, previous: RunInfo | None, now: float | None = None
) -> RunInfo:
    """The run's metadata once ``checkpoint`` (with ``seq`` set) is committed.

    Status, latest id, seq, event, step and error (``Type: message``, or none)
    come from the checkpoint; ``flow`` too when the checkpoint has one. Name
    (``meta.name``) and lineage are taken from the run's first checkpoint.
    ``created_at`` is the first commit's time, ``updated_at`` this commit's.
    """
    now = time.time() if now is None else now
    if previous is None:
        info = RunInfo(run_id=checkpoint.run_id, created_at=now)
        info.name = checkpoint.meta.name or None
        if checkpoint.lineage is not None:
            info.parent_run_id = checkpoint.lineage.parent_run_id
            info.parent_checkpoint_id = checkpoint.lineage.parent_checkpoint_id
            info.branch = checkpoint.lineage.branch
    else:
        info = previous.model_copy()
    info.status = checkpoint.status
    info.latest = checkpoint.id
    info.seq = checkpoint.seq
    info.event = checkpoint.event
    info.step = checkpoint.step
    info.updated_at = max(now, info.created_at)
    info.flow = checkpoint.flow or info.flow
    error = checkpoint.error
    info.error = f"{error.type}: {error.message}" if error is not None else None
    info.version = checkpoint.version
    links = checkpoint.meta.links
    info.child_of = links.parent.run_id if links.parent is not None else None
    info.child_runs = [link.run_id for link in links.children.values()]
    info.not_before = checkpoint.meta.scheduling.not_before
    return info


def run_info_updated(info: RunInfo, fields: dict[str, Any], now: float | None = None) -> RunInfo:
    """``info`` with ``fields`` set and ``updated_at`` bumped (unless given)."""
    unknown = set(fields) - (set(RunInfo.model_fields) - _FIXED_RUN_FIELDS)
    if unknown:
        raise StoreError(
            f"cannot update run {info.run_id}: unknown field(s) {', '.join(sorted(unknown))}",
            run_id=info.run_id,
        )
    data = info.model_dump()
    data["updated_at"] = time.time() if now is None else now
    data.update(fields)
    try:
        return RunInfo.model_validate(data)
    except ValidationError as exc:
        raise StoreError(
            f"cannot update run {info.run_id}: {exc.errors()[0]['msg']}", run_id=info.run_id
        ) from None


def forked(
    source: Checkpoint,
    new_run_id: str,
    branch: str | None,
    state: dict[str, Any] | None,
) -> Checkpoint:
    """The first checkpoint of a fork: a copy of ``source`` in run ``new_run_id``.

    New id, event ``forked``, status ``pending`` (nothing of the new run has run),
    no activation or error, lineage pointing at the source; ``state`` replaces the
    copied state when given, and a state ``id`` becomes ``new_run_id`` (the flow
    state's id is its run id). The store assigns ``seq`` (always 1).
    """
    new_state = dict(source.state if state is None else state)
    if "id" in new_state:
        new_state["id"] = new_run_id
    return source.model_copy(
        update={
            "id": ids.checkpoint_id(),
            "run_id": new_run_id,
            "seq": 0,
            "event": FORKED_EVENT,
            "activation": None,
            "attempt": None,
            "status": RunStatus.PENDING,
            "state": new_state,
            "lineage": Lineage(
                parent_run_id=source.run_id, parent_checkpoint_id=source.id, branch=branch
            ),
            "created_at": time.time(),
            "error": None,
            "usage": None,  # the source step's tokens, not this checkpoint's
        },
        deep=True,
    )


def check_activation(
    checkpoint: Checkpoint, recorded_attempt: str | None, recorded_id: str
) -> None:
    """Raise :class:`StaleAttempt` unless ``checkpoint`` is the recorded attempt again."""
    if checkpoint.attempt != recorded_attempt:
        raise StaleAttempt(
            f"activation {checkpoint.activation} of run {checkpoint.run_id} was already "
            f"committed by attempt {recorded_attempt} as checkpoint {recorded_id}",
            run_id=checkpoint.run_id,
            activation=checkpoint.activation,
            checkpoint_id=recorded_id,
        )


def conflict(run_id: str, expected: int, actual: int) -> CommitConflict:
    """The :class:`CommitConflict` for a compare-and-set commit that lost."""
    return CommitConflict(
        f"run {run_id} is at seq {actual}, not the expected {expected}",
        run_id=run_id,
        expected=expected,
        actual=actual,
    )
