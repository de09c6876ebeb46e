"""Checkpoint stores: a small protocol, the Redis store, and SQLite / JSON-directory providers."""
