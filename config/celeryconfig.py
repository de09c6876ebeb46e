"""Celery settings of the runner's app (``app.config_from_object("config.celeryconfig")``).

``broker_url`` and ``result_backend`` are not here: the app takes them from the runner settings
(``RUNNER_REDIS_URL``, or the embedded Redis) when it is created.
"""

# JSON only, never pickle: every message and result is readable and safe to load.
task_serializer = "json"  # how task arguments are sent
result_serializer = "json"  # how results are stored
accept_content = ["json"]  # workers refuse any other content type
result_accept_content = ["json"]  # clients refuse results in any other format

# At-least-once execution; the idempotent, fenced checkpoint commit makes it exactly-once.
task_acks_late = True  # ack after the step ran, so a crash mid-step redelivers it
task_reject_on_worker_lost = True  # a killed worker's task is requeued, not acked as failed
worker_prefetch_multiplier = 1  # a worker reserves one step at a time; long steps hog nothing
# On a lost broker connection (a Redis restart), let running steps finish: a step is an LLM
# call that costs money, its commit goes to the checkpoint store (which workers retry for
# seconds), and the redelivered message then finds the step committed and does nothing.
# (Celery 6 will default to cancelling them; the worker silences Celery 5's warning about it.)
worker_cancel_long_running_tasks_on_connection_loss = False

# Events, so Flower shows every step as it is sent, started and finished.
worker_send_task_events = True  # workers emit task-started/succeeded/failed events
task_send_sent_event = True  # producers emit task-sent, so queued steps show up too
task_track_started = True  # a step reports STARTED, not just PENDING, while it runs
result_extended = True  # results keep task name, args and worker, for Flower and the CLI

broker_connection_retry_on_startup = True  # keep retrying a broker not up yet at startup
result_expires = 86400  # Celery results live a day; checkpoints in the store are the record

# With the Redis broker an unacked message is redelivered after the visibility timeout, even if
# its step is still running. We recover crashed steps with leases and heartbeats instead, so the
# timeout only needs to exceed the longest step (and the longest retry countdown).
broker_transport_options = {"visibility_timeout": 3600}  # seconds
