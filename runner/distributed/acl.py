"""Least-privilege Redis ACL rules of a deployment: its workers, producers and a read-only
console, each limited to the commands it runs and the keys and channels of this prefix,
queue and Celery exchanges.

What each touches (kombu 5.7's Redis transport, Celery 5.7; ``P`` the prefix, ``Q`` the
queue, ``D`` the broker's database number):

* the store: every key under ``P:`` and the runs' ``P:{R}:stopped`` channels;
* the steps' queues: the lists ``Q`` and ``Q.<name>`` (routed steps), each with its priority
  lists ``Q\\x06\\x16<p>``, and kombu's queue bindings ``_kombu.binding*``;
* workers besides: kombu's unacknowledged messages (``unacked``, ``unacked_index``,
  ``unacked_mutex``), their remote-control mailboxes (lists ``*.celery.P.pidbox*``, channel
  ``/D.celery.P.pidbox``);
* workers and producers: the start-up probes' private queues (``runner.probe.*``);
* Celery events: the channels ``/D.celeryev.P/<event>`` (producers and workers publish,
  Flower and the console's live view subscribe with the pattern ``/D.celeryev.P/*``);
* step results, only with ``RUNNER_TASK_RESULTS``: ``celery-task-meta-*`` keys and channels.

A pattern subscription is allowed only by the same pattern, written literally; the other
channel and key rules are globs.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from celery import Celery

from runner.distributed.broker import PROBE_PREFIX
from runner.settings import RunnerSettings

_COMMANDS = {
    # Workers: data commands, Lua (every commit is one script), pub/sub, MULTI (kombu),
    # blocking pops (kombu's BRPOP), WAIT (a commit's replicas): nothing that administers.
    # INFO (in @dangerous, so granted after it) tells a submit (a schedule's tick too) the
    # store's memory and limit: past its high-water mark it is refused (runner.store.memory).
    "worker": "-@all +@read +@write +@scripting +@pubsub +@transaction +@connection "
    "+@blocking +time +wait -@dangerous +info",
    # Producers send and wait: the same without blocking pops.
    "producer": "-@all +@read +@write +@scripting +@pubsub +@transaction +@connection "
    "+time +wait -@blocking -@dangerous +info",
    # The console browses: reads only, its live view's subscriptions, and the store's
    # scripts (the latest checkpoint is read by one). Redis checks every command a script
    # runs against the user's rules, so a script's write is refused all the same; the keys
    # cannot be read-only (%R~) because Redis takes a script's keys for written ones. INFO
    # for the store's memory gauges.
    "console": "-@all +@read +@connection +subscribe +psubscribe +unsubscribe +punsubscribe "
    "+evalsha +script|load -@dangerous +info",
}


def broker_db(app: Celery) -> int:
    """The database number of ``app``'s Redis broker (kombu's pub/sub channels name it); of
    kombu's ``sentinel://H:P/D;...`` form too."""
    path = urlsplit(str(app.conf.broker_url).split(";")[0]).path.strip("/")
    return int(path) if path.isdigit() else 0


def acl_rules(app: Celery, settings: RunnerSettings) -> dict[str, str]:
    """``ACL SETUSER`` rules (after ``on`` and the password) of each role: ``worker``,
    ``producer`` and ``console`` of the deployment ``app`` and ``settings`` describe."""
    prefix, queue, db = settings.prefix, settings.queue, broker_db(app)
    control, events = app.conf.control_exchange, app.conf.event_exchange
    store = f"~{prefix}:*"
    # The start-up probes' private queues too: the outbox's probe runs where steps are sent.
    queues = f"~{queue} ~{queue}?* ~_kombu.binding* ~{PROBE_PREFIX}*"
    event_channels = f"&/{db}.{events}/*"
    results = " ~celery-task-meta-* &celery-task-meta-*" if settings.task_results else ""
    return {
        "worker": f"{_COMMANDS['worker']} {store} {queues} ~unacked* ~*.{control}.pidbox* "
        f"&{prefix}:* {event_channels} &/{db}.{control}.pidbox{results}",
        "producer": f"{_COMMANDS['producer']} {store} {queues} &{prefix}:* "
        f"{event_channels}{results}",
        "console": f"{_COMMANDS['console']} {store} ~{queue} ~{queue}?* "
        f"&{prefix}:* {event_channels}",
    }
