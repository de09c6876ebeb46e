"""Checkpoint stores: a small protocol, the Redis store, and SQLite / JSON-directory providers.

Every ``runner`` command imports this layer, so what it defines at import is paid by each cold
command: its immutable in-memory records are :class:`typing.NamedTuple`, not frozen
dataclasses (on Python 3.11 a frozen dataclass takes ~0.4 ms to define, a NamedTuple
~0.06 ms; the store's fifteen on the CLI's path were ~6 ms of a cold ``runner runs --json``,
``bench/cli_cold.py``). What is stored is pydantic (:mod:`runner.store.models`).
"""
