"""Runnable example flows and a producer script."""
