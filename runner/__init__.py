"""Durable CrewAI-style flows and crews on Celery workers, with checkpoints in Redis."""
