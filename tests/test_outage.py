"""A lost connection is said once: one WARNING when it goes, one INFO when it is back, no
traceback, however many background threads notice it (:mod:`runner.distributed.outage`)."""

from __future__ import annotations

import logging
import threading

import pytest

from runner.distributed import outage
from runner.errors import StoreError, StoreUnavailable

DOWN = StoreUnavailable("Redis at redis://127.0.0.1:1/0 is unreachable: Error 111 refused")


def test_many_threads_losing_redis_say_it_once_and_its_return_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    watch = outage.Watch("Redis at redis://127.0.0.1:1/0")
    caplog.set_level(logging.INFO, logger="runner.worker")
    threads = [threading.Thread(target=watch.lost, args=(DOWN,)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    watch.back()
    watch.back()  # a call that worked with no outage says nothing
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said == [
        (
            "WARNING",
            "lost the connection to Redis at redis://127.0.0.1:1/0 (Redis at "
            "redis://127.0.0.1:1/0 is unreachable: Error 111 refused); the worker waits and "
            "reconnects",
        ),
        ("INFO", said[1][1]),
    ]
    assert said[1][1].startswith("connection to Redis at redis://127.0.0.1:1/0 is back after ")
    assert all(r.exc_info is None for r in caplog.records)


def test_report_takes_connection_errors_and_leaves_the_rest_to_the_caller(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outage.watch().back()  # an outage another test left open ends here, before the capture
    outage.watch().back_at = -float("inf")  # and long ago: this one is a new outage
    caplog.set_level(logging.INFO, logger="runner.worker")
    caplog.clear()
    assert outage.report(ConnectionRefusedError(111, "Connection refused")) is True
    assert outage.report(DOWN) is True  # the same outage: nothing more said
    assert outage.report(StoreError("Redis error: WRONGTYPE")) is False
    assert outage.report(ValueError("a bug")) is False
    outage.watch().back()
    levels = [r.levelname for r in caplog.records]
    assert levels == ["WARNING", "INFO"]


def test_losing_it_again_while_it_settles_is_the_same_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Right after Redis answers again, connections opened before the outage fail one by
    one ("the broker connection is closed"), and a restarted Redis may still be loading:
    that is the same outage settling, not a new one to say."""
    watch = outage.Watch("Redis at redis://127.0.0.1:1/0")
    caplog.set_level(logging.INFO, logger="runner.worker")
    watch.lost(DOWN)
    watch.back()
    for _ in range(3):  # stale sockets failing after the return
        watch.lost("the broker connection is closed")
        watch.back()
    assert [r.levelname for r in caplog.records] == ["WARNING", "INFO"]
    watch.back_at -= outage.SETTLE  # long after: a new outage is said again
    watch.lost(DOWN)
    watch.back()
    assert [r.levelname for r in caplog.records] == ["WARNING", "INFO", "WARNING", "INFO"]
