"""The ``runner`` command's entry point (the console script, and ``python -m runner``).

A command lives for one call, and most of its time cold is importing its libraries
(typer, redis-py, pydantic and the models built on it): tens of thousands of objects that
live as long as the process. Collecting garbage among them while they are imported finds
none and cost about a fifth of a cold ``runner runs --json`` (``make bench``, cli_cold),
so the collector waits until the imports are done, then :func:`gc.freeze` moves what
they made out of its sight; the command itself runs with the collector on as usual.
"""

from __future__ import annotations

import gc


def main() -> None:
    """Run the ``runner`` command line."""
    gc.disable()
    try:
        from runner.cli import main as run_command
    finally:
        gc.enable()
        gc.freeze()
    run_command()


if __name__ == "__main__":
    main()
