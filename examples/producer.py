"""Submit example runs to the workers and print their ids.

python -m examples.producer --count 3
python -m examples.producer --flow examples.fanout:FanoutFlow --input topic=redis --wait
"""

from __future__ import annotations

import argparse
import json
import sys

from runner.distributed.client import submit
from runner.errors import RunnerError


def _inputs(pairs: list[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"error: --input {pair!r} is not key=value")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def main(argv: list[str] | None = None) -> int:
    """Submit ``--count`` runs of ``--flow``; with ``--wait`` print each outcome."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flow", default="examples.research:ResearchFlow")
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--input", action="append", default=[], help="key=value (JSON value)")
    parser.add_argument("--wait", action="store_true", help="wait for each run to finish")
    args = parser.parse_args(argv)
    try:
        handles = [submit(args.flow, _inputs(args.input)) for _ in range(args.count)]
        for handle in handles:
            print(handle.run_id, flush=True)
        if args.wait:
            for handle in handles:
                print(f"{handle.run_id} {handle.wait().value}")
    except RunnerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
