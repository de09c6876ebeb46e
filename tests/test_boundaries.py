"""Two boundaries, checked on the source (ast, as ``tests/test_layers.py`` checks layers):

* **the store protocol**: outside ``runner/store`` nothing touches redis-py, a store's raw
  client or its key builder, nor the store modules built on them; code asks the store
  (:class:`runner.store.base.DeploymentStore`);
* **the broker adapter**: outside ``runner/distributed/broker.py`` nothing imports kombu or
  reaches inside Celery; Celery's public API (the names in :data:`PUBLIC_CELERY`, the app's
  documented methods and settings) may be used anywhere.

Each violation is reported as ``file:line: what``.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("runner", "workers")
"""The library and the workers' app. Examples (a demo counting its own calls in Redis), tests
and benchmarks read Redis directly on purpose."""

STORE = ROOT / "runner" / "store"
BROKER = ROOT / "runner" / "distributed" / "broker.py"

REDIS_ALLOWED = {
    BROKER: "the broker's own Redis, in kombu's key layout (the broker adapter)",
    ROOT / "runner" / "embedded.py": "starts, pings and shuts down its own redis-server",
}
"""Files outside ``runner/store`` that may use redis-py, and why: neither touches the store's
client or keys."""

STORE_INTERNALS = ("runner.store.keys", "runner.store.scripts", "runner.store.pools")
"""Store modules only the store's own modules import: the key builder, the Lua scripts and
redis-py's pool internals."""
STORE_RAW_NAMES = {
    "Timers",
    "ScheduleBook",
    "LimitBook",
    "QueueBook",
    "Roster",
    "DeploymentRecords",
}
"""The store's classes over a raw client: outside the store, their records are the
protocol's methods."""
RAW_ATTRIBUTES = {"client", "keys"}
"""A store's raw redis-py client and key builder (``rt.store.client``, ``store.keys``)."""

PUBLIC_CELERY = {
    "celery": {"Celery", "signals", "current_task"},
    "celery.exceptions": {"Ignore", "Retry", "TimeLimitExceeded"},
}
"""What may be imported from Celery outside the broker adapter: the app class, signals, the
current task, and the exceptions a task raises or a worker reports (all documented API)."""
CELERY_INTERNAL_ATTRIBUTES = {"amqp", "producer_pool", "batch"}
"""Attributes that reach inside Celery or kombu: the app's AMQP layer (queues, router), its
producer pool, kombu's ``Producer.batch``."""


def _files() -> Iterator[Path]:
    for top in SCANNED:
        yield from sorted((ROOT / top).rglob("*.py"))


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"


def _imports(tree: ast.AST) -> Iterator[tuple[ast.AST, str, list[str]]]:
    """(node, module, names) of every absolute import, at any depth."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node, alias.name, []
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node, node.module, [alias.name for alias in node.names]


def _of_a_store(node: ast.Attribute) -> bool:
    return ast.unparse(node.value).split(".")[-1] in {"store", "_store"}


def store_violations(path: Path, tree: ast.AST) -> list[str]:
    """Uses of redis-py, a store's raw client or key builder, or the store's raw modules."""
    if path.is_relative_to(STORE):
        return []
    found = []
    for node, module, names in _imports(tree):
        top = module.split(".")[0]
        if top == "redis" and path not in REDIS_ALLOWED:
            found.append(f"{_where(path, node)}: imports {module}")
        if module in STORE_INTERNALS or any(f"{module}.{n}" in STORE_INTERNALS for n in names):
            found.append(f"{_where(path, node)}: imports {module} {names or ''}".rstrip())
        if module.startswith("runner.store") and STORE_RAW_NAMES & set(names):
            found.append(f"{_where(path, node)}: imports {sorted(STORE_RAW_NAMES & set(names))}")
        if module == "runner.store.connection" and "client" in names:
            found.append(f"{_where(path, node)}: imports runner.store.connection.client")
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        if node.attr in RAW_ATTRIBUTES and _of_a_store(node):
            found.append(f"{_where(path, node)}: {ast.unparse(node)}")
        raw_connect = node.attr == "client" and ast.unparse(node.value) == "connection"
        if raw_connect and path not in REDIS_ALLOWED:
            found.append(f"{_where(path, node)}: {ast.unparse(node)} (a raw redis-py client)")
    return found


def broker_violations(path: Path, tree: ast.AST) -> list[str]:
    """Imports of kombu or of Celery beyond its public API, and Celery's internal attributes."""
    if path == BROKER:
        return []
    found = []
    for node, module, names in _imports(tree):
        top = module.split(".")[0]
        if top == "kombu":
            found.append(f"{_where(path, node)}: imports {module}")
        elif top == "celery":
            allowed = PUBLIC_CELERY.get(module)
            beyond = [n for n in names if allowed is None or n not in allowed]
            if beyond or not names:
                found.append(f"{_where(path, node)}: imports {module} {beyond or ''}".rstrip())
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in CELERY_INTERNAL_ATTRIBUTES:
            found.append(f"{_where(path, node)}: {ast.unparse(node)}")
    return found


def _in_order(found: list[str]) -> list[str]:
    def place(line: str) -> tuple[str, int]:
        where = line.split(": ", 1)[0]
        return where.rpartition(":")[0], int(where.rpartition(":")[2])

    return sorted(found, key=place)


def _scan(check: Callable[[Path, ast.AST], list[str]]) -> list[str]:
    found: list[str] = []
    for path in _files():
        found += check(path, ast.parse(path.read_text()))
    return _in_order(found)


def test_nothing_outside_the_store_touches_redis_its_client_or_its_keys() -> None:
    found = _scan(store_violations)
    assert found == [], "ask the store (DeploymentStore) instead:\n" + "\n".join(found)


def test_nothing_outside_the_broker_adapter_touches_kombu_or_celery_internals() -> None:
    found = _scan(broker_violations)
    assert found == [], "add a function to runner/distributed/broker.py:\n" + "\n".join(found)


def _violations(check: Callable[[Path, ast.AST], list[str]], source: str, where: Path) -> list[str]:
    return _in_order(check(where, ast.parse(source)))


def test_the_store_scan_names_the_file_and_line_of_each_use() -> None:
    source = """
import redis
from runner.store.keys import Keys
from runner.store.timers import Timers, STARTS


def f(rt):
    rt.store.client.hset(rt.store.keys.rates(), "a", "b")
    connection.client("redis://")
"""
    where = ROOT / "runner" / "distributed" / "example.py"
    found = _violations(store_violations, source, where)
    assert [line.split(": ", 1)[0] for line in found] == [
        "runner/distributed/example.py:2",
        "runner/distributed/example.py:3",
        "runner/distributed/example.py:4",
        "runner/distributed/example.py:8",
        "runner/distributed/example.py:8",
        "runner/distributed/example.py:9",
    ]
    assert _violations(store_violations, source, STORE / "example.py") == []


def test_the_broker_scan_allows_celery_s_public_api_only() -> None:
    source = """
from celery import Celery, signals
from celery.exceptions import Retry
from celery.worker import state
from kombu.exceptions import OperationalError


def f(app):
    app.send_task("x")
    app.control.revoke("t")
    app.amqp.queues.select(["q"])
"""
    where = ROOT / "runner" / "distributed" / "example.py"
    found = _violations(broker_violations, source, where)
    assert found == [
        "runner/distributed/example.py:4: imports celery.worker ['state']",
        "runner/distributed/example.py:5: imports kombu.exceptions",
        "runner/distributed/example.py:11: app.amqp",
    ]
    assert _violations(broker_violations, source, BROKER) == []
