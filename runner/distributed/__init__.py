"""Running flows on Celery workers: app, step tasks, dispatch, leases, recovery."""
