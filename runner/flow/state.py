"""Flow state: the ``FlowState`` base, JSON dumping, and merging parallel branches.

Everything stored is JSON: :func:`dump_state` turns a pydantic state or a dict into plain JSON
values (raising :class:`NotSerializable` with the key path of the first value that cannot be;
a run that keeps no checkpoints dumps leniently, keeping such a value as it is).

Parallel branches each start from a snapshot of the state. When one finishes, the fields it
changed relative to its snapshot (:func:`diff`) are applied onto the latest state
(:func:`apply_changes`), so branches writing different fields keep each other's writes. A
field written by two branches is merged by the reducer declared on it
(``items: Annotated[list[str], append]``), else the last commit wins and the field is
reported as a conflict.
"""

from __future__ import annotations

import json
import math
import threading
import types
from collections.abc import Mapping
from enum import Enum
from typing import Any, Protocol, Union, get_args, get_origin
from uuid import uuid4

from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic_core import PydanticSerializationError, to_jsonable_python

from runner.errors import NotSerializable


class FlowState(BaseModel):
    """Base of structured flow states: an ``id`` (the run id) defaulting to a fresh UUID."""

    id: str = Field(default_factory=lambda: str(uuid4()))
    """The run's id; a fresh UUID4 string unless given."""


_with_id: dict[type[BaseModel], type[BaseModel]] = {}
_with_id_lock = threading.Lock()


def with_id(model: type[BaseModel]) -> type[BaseModel]:
    """``model`` if it has an ``id`` field, else a subclass of it adding :class:`FlowState`'s
    (CrewAI gives a plain ``BaseModel`` state an id the same way). Made once per model."""
    if "id" in model.model_fields:
        return model
    with _with_id_lock:
        derived = _with_id.get(model)
        if derived is None:
            derived = create_model(
                model.__name__,
                __base__=model,
                __module__=model.__module__,
                id=(str, Field(default_factory=lambda: str(uuid4()))),
            )
            derived.__qualname__ = model.__qualname__
            derived.__doc__ = model.__doc__
            _with_id[model] = derived
        return derived


# --- reducers -------------------------------------------------------------------------------


class Reducer(Protocol):
    """Merges a step's contribution to a field into the field's latest value."""

    def __call__(self, current: Any, incoming: Any, /) -> Any:
        """The field's new value given its latest value and the step's contribution."""
        ...


def append(current: Any, incoming: Any) -> list[Any]:
    """List reducer: the latest items followed by the items the step added."""
    return [*current, *incoming]


def merge_dict(current: Any, incoming: Any) -> dict[str, Any]:
    """Dict reducer: the latest entries updated with the entries the step added or changed."""
    return {**current, **incoming}


def add(current: Any, incoming: Any) -> Any:
    """Number reducer: the latest value plus what the step added to it."""
    return current + incoming


def reducers_for(model_cls: type[BaseModel] | None) -> dict[str, Reducer]:
    """Field name -> reducer, from callables in the fields' ``Annotated`` metadata.

    ``None`` (dict state) gives no reducers. If a field has several, the last one counts.
    """
    found: dict[str, Reducer] = {}
    if model_cls is None:
        return found
    for name, info in model_cls.model_fields.items():
        for meta in info.metadata:
            if callable(meta) and not isinstance(meta, type):
                found[name] = meta
    return found


# --- JSON -----------------------------------------------------------------------------------


def values_from_text(model: type[BaseModel] | None, texts: Mapping[str, str]) -> dict[str, Any]:
    """``key=value`` text (a command line's ``--input``/``--set``) as state values.

    Each value is read as JSON when it parses (``3``, ``true``, ``[1, 2]``, ``"x"``), else
    kept as text; but a field of ``model`` typed ``str`` (or ``str | None``) keeps its text
    as typed when JSON would read it as another type, so ``zip=02134`` or an id such as
    ``12345678`` stays the string the field wants (``null`` is None where the field takes it).
    """
    fields = model.model_fields if model is not None else {}
    values: dict[str, Any] = {}
    for key, text in texts.items():
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        field = fields.get(key)
        if field is not None and not isinstance(value, str) and _wants_text(field.annotation):
            # ``null`` stays None for a field that takes None (``str | None``).
            keeps_none = value is None and _takes_none(field.annotation)
            value = value if keeps_none else text
        values[key] = value
    return values


def _wants_text(annotation: Any) -> bool:
    if annotation is str:
        return True
    if get_origin(annotation) in (Union, types.UnionType):
        return {a for a in get_args(annotation) if a is not type(None)} == {str}
    return False


def _takes_none(annotation: Any) -> bool:
    return get_origin(annotation) in (Union, types.UnionType) and type(None) in get_args(annotation)


def _not_serializable(path: str, value: object, detail: str = "") -> NotSerializable:
    where = path or "<root>"
    return NotSerializable(
        f"not JSON-serializable at {where}: {type(value).__name__}{detail}",
        path=where,
        type_name=type(value).__name__,
    )


def _key(key: object, path: str) -> str:
    if isinstance(key, Enum):
        key = key.value
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, bool | int | float):
        return json.dumps(key)  # as json.dumps writes such keys
    raise _not_serializable(f"{path}[{key!r}]", key, " (as a dict key)")


def _child(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def jsonable(value: Any, path: str = "", *, strict: bool = True) -> Any:
    """``value`` as plain JSON values (dict, list, str, int, float, bool, None).

    Models, datetimes, UUIDs, Decimals, Enums, paths and dataclasses are converted as pydantic's
    JSON mode does. Anything else raises :class:`NotSerializable` naming its key path
    (``items[2].when``, with ``path`` as the prefix); with ``strict=False`` it is kept as the
    object itself, so the state of a run that is never persisted may hold it (as CrewAI's may).
    """
    if isinstance(value, Enum):
        return jsonable(value.value, path, strict=strict)
    if value is None or isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, BaseModel):
        try:
            return value.model_dump(mode="json")
        except PydanticSerializationError as exc:
            # Python mode always works; walking it names the offending key (or keeps it).
            found = jsonable(value.model_dump(), path, strict=strict)
            if strict:
                raise _not_serializable(path, value, f" ({exc})") from None
            return found
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            try:
                name = _key(key, path)
            except NotSerializable:
                if strict:
                    raise
                out[key] = item
                continue
            out[name] = jsonable(item, _child(path, name), strict=strict)
        return out
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v, f"{path}[{i}]", strict=strict) for i, v in enumerate(value)]
    try:
        converted = to_jsonable_python(value)
    except PydanticSerializationError:
        if strict:
            raise _not_serializable(path, value) from None
        return value
    return jsonable(converted, path, strict=strict)


def dump_state(state: BaseModel | Mapping[str, Any], *, strict: bool = True) -> dict[str, Any]:
    """The state as a JSON-safe dict (a model via ``model_dump(mode="json")``).

    Raises :class:`NotSerializable` naming the key path of a value that is not JSON; with
    ``strict=False`` (a run that keeps no checkpoints) such a value is kept as it is.
    """
    if not isinstance(state, BaseModel | Mapping):
        raise _not_serializable("", state, " (state must be a pydantic model or a dict)")
    dumped = jsonable(state, strict=strict)
    assert isinstance(dumped, dict)
    return dumped


# --- diff and merge -------------------------------------------------------------------------

_MISSING: Any = object()


def same(a: Any, b: Any) -> bool:
    """Equality of JSON values that tells ``1``, ``1.0`` and ``True`` apart (NaN equals NaN)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


class Changes(BaseModel):
    """What one step did to the top-level fields of the state it started from."""

    model_config = ConfigDict(frozen=True)

    set: dict[str, Any] = Field(default_factory=dict)
    """Fields the step added or changed, with their new (JSON) values."""
    removed: frozenset[str] = frozenset()
    """Fields the step deleted (dict state only)."""

    @property
    def empty(self) -> bool:
        """True when the step changed nothing."""
        return not self.set and not self.removed


def diff(base: Mapping[str, Any], new: Mapping[str, Any]) -> Changes:
    """The top-level fields that differ between ``base`` and ``new`` (both JSON dicts)."""
    changed = {k: v for k, v in new.items() if k not in base or not same(base[k], v)}
    return Changes(set=changed, removed=frozenset(base.keys() - new.keys()))


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def contribution(before: Any, after: Any) -> Any:
    """What a step added to a field that went from ``before`` to ``after``.

    A list that still starts with ``before``: the items appended. A dict: the entries added
    or changed. A number: the difference. Anything else (or a field the step created): ``after``.
    """
    if isinstance(before, list) and isinstance(after, list):
        if len(after) >= len(before) and same(after[: len(before)], before):
            return after[len(before) :]
    elif isinstance(before, dict) and isinstance(after, dict):
        return {k: v for k, v in after.items() if k not in before or not same(before[k], v)}
    elif _is_number(before) and _is_number(after):
        return after - before
    return after


def _merge_field(latest: Any, before: Any, after: Any, reducer: Reducer | None) -> tuple[Any, bool]:
    """The merged value of one changed field and whether it is a conflict."""
    if latest is _MISSING or same(latest, before):
        return after, False  # no other commit changed it since the step began
    if reducer is not None:
        return reducer(latest, contribution(before, after)), False
    return after, not same(latest, after)  # the same change twice is no conflict


def apply_changes(
    latest: Mapping[str, Any],
    base: Mapping[str, Any],
    changes: Changes,
    reducers: Mapping[str, Reducer],
) -> tuple[dict[str, Any], list[str]]:
    """Apply a step's ``changes`` (made against ``base``) onto ``latest``.

    For each field the step set, with ``before = base[field]``:

    * if ``latest[field]`` is missing or equals ``before`` (no other commit changed it since
      the step began): the step's value is taken;
    * else, with a reducer: ``reducer(latest[field], contribution(before, new))``; for ``append``
      that is the latest list followed by the items the step appended (or, if the step did not
      merely append, followed by its whole list); for ``add`` the latest number plus the step's
      difference; for ``merge_dict`` the latest dict updated with the entries the step set.
      Two branches making the same addition both count (``[*base, "x", "x"]``);
    * else (no reducer): the step's value wins (last commit wins) and the field is a conflict,
      unless ``latest[field]`` already equals the step's value.

    A field the step removed is deleted; it is a conflict if another commit had changed it.
    Returns the merged state (a new dict) and the conflicting field names, in field order.
    """
    merged = dict(latest)
    conflicts: list[str] = []
    for name, after in changes.set.items():
        value, conflict = _merge_field(
            latest.get(name, _MISSING), base.get(name, _MISSING), after, reducers.get(name)
        )
        merged[name] = value
        if conflict:
            conflicts.append(name)
    for name in sorted(changes.removed):
        if name in merged:
            if not same(merged[name], base.get(name, _MISSING)):
                conflicts.append(name)
            del merged[name]
    return merged, conflicts
