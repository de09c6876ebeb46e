"""``python -m runner``: the ``runner`` command."""

from runner.cli import main

main()
