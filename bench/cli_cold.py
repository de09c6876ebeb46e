"""Benchmark: a cold ``runner runs --json`` against importing its own libraries.

Usage::

    python bench/cli_cold.py [--pairs 15] [--runs 20] [--url URL]

Each case is a fresh interpreter (``subprocess``, wall clock with ``time.perf_counter``),
as a user meets the CLI in a shell:

* **runner runs --json**: the installed console script listing ``--runs`` stored runs (20,
  the default ``--limit``) of a fresh prefix: settings, the Redis of the deployment, one
  round trip per page of the run index and per run;
* **import redis, pydantic, typer**: ``python -c`` importing the libraries the command
  itself needs, the baseline (the issue measured 0.50 s against 0.23 s, 2.4x);
* two rows that tell where the difference goes: ``import runner`` (the package's own
  imports: authoring API, crews, stores) and ``import runner.cli`` (the command group and
  what every command shares, settings and store; no command module, which is imported when
  one of its commands runs; no Redis).

Every ``python -c`` case imports as the console script (:mod:`runner.__main__`) does: the
garbage collector off during the imports, then :func:`gc.freeze` (:data:`GC_TREATMENT`), so
the command and its baseline are treated alike and the ratio measures what the command adds,
not what the collector costs only one side. ``--plain-gc`` adds the baseline without it, for
reference.

The cases run in rounds, their order rotating, ``--pairs`` timed rounds after one untimed,
so a noisy neighbour on this shared machine weighs on all of them alike. The table gives each
case's median, min and max in ms and its ratio to the baseline: the median over the rounds of
(case / baseline in the same round). Target: ``runner runs --json`` within 1.5x of the
baseline. It also checks that the command imported neither Celery nor kombu.

Redis: ``--url``, else ``$RUNNER_BENCH_REDIS_URL``, else DB 15 of 127.0.0.1:6379, else a
private embedded server (see :mod:`bench._common`). The runs are written under a fresh
prefix (flows kicked off in this process) and deleted at the end; no DB is flushed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from runner import CheckpointConfig, Flow, FlowState, listen, start
from runner.errors import StoreUnavailable
from runner.store.redis import RedisProvider

try:
    from bench._common import bench_redis, count_keys, delete_prefix, print_table
except ModuleNotFoundError:  # run as `python bench/cli_cold.py`: bench/ is on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from _common import (  # type: ignore[no-redef]
        bench_redis,
        count_keys,
        delete_prefix,
        print_table,
    )

TARGET = 1.5
"""``runner runs --json`` may take at most this many times the baseline's imports."""
UNSET = ("PYTHONDONTWRITEBYTECODE",)
"""Left out of the cases' environment: an installed package has its bytecode cached (the
untimed round writes it), so no case compiles its sources in the timed rounds."""
GC_TREATMENT = "import gc; gc.disable(); {imports}; gc.enable(); gc.freeze()"
"""How every ``python -c`` case imports: as :func:`runner.__main__.main` does."""
BASELINE = "python -c 'import redis, pydantic, typer' (GC as the command's)"
PLAIN = "python -c 'import redis, pydantic, typer' (GC on, for reference)"
COMMAND = "runner runs --json"
PROBE = """
import json, sys
from runner.cli import main

sys.argv = ["runner", "runs", "--json"]
try:
    main()
except SystemExit:
    pass
print(json.dumps([name for name in ("celery", "kombu") if name in sys.modules]))
"""
"""The command run in process, then the names of Celery and kombu if they were imported."""


class NoteState(FlowState):
    """A topic and the note written about it."""

    topic: str = ""
    note: str = ""


class NoteFlow(Flow[NoteState]):
    """Two steps: enough for a run with a few checkpoints to list."""

    @start()
    def read(self) -> str:
        return f"about {self.state.topic}"

    @listen(read)
    def write(self, read: str) -> str:
        self.state.note = read
        return read


def seed(url: str, prefix: str, runs: int) -> None:
    """``runs`` finished runs of :class:`NoteFlow` under ``prefix`` (in this process)."""
    provider = RedisProvider(url, prefix=prefix)
    try:
        for i in range(runs):
            flow = NoteFlow(checkpoint=CheckpointConfig(provider=provider))
            flow.kickoff(inputs={"topic": f"t{i}"})
    finally:
        provider.close()


def runner_script() -> list[str]:
    """The installed ``runner`` console script beside this interpreter, else ``-m``."""
    script = Path(sys.executable).with_name("runner")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "runner.cli"]


def case_env(url: str, prefix: str) -> dict[str, str]:
    """This environment without ``RUNNER_*`` settings nor :data:`UNSET`, on ``url``/``prefix``."""
    kept = {k: v for k, v in os.environ.items() if k not in UNSET and not k.startswith("RUNNER_")}
    return {**kept, "RUNNER_REDIS_URL": url, "RUNNER_PREFIX": prefix}


def treated(imports: str) -> list[str]:
    """``python -c`` running ``imports`` with :data:`GC_TREATMENT`."""
    return [sys.executable, "-c", GC_TREATMENT.format(imports=imports)]


def cases(plain_gc: bool = False) -> dict[str, list[str]]:
    """Name -> argv of each timed case (``plain_gc``: with the untreated baseline too)."""
    named = {
        COMMAND: [*runner_script(), "runs", "--json"],
        BASELINE: treated("import redis, pydantic, typer"),
        "python -c 'import redis, pydantic.main, pydantic.types, typer' (GC as the "
        "command's; pydantic's model machinery its models need too, for reference)": treated(
            "import redis, pydantic.main, pydantic.types, typer"
        ),
        "python -c 'import runner' (GC as the command's)": treated("import runner"),
        "python -c 'import runner.cli' (GC as the command's)": treated("import runner.cli"),
    }
    if plain_gc:
        named[PLAIN] = [sys.executable, "-c", "import redis, pydantic, typer"]
    return named


def once(argv: Sequence[str], env: dict[str, str]) -> tuple[float, str]:
    """Seconds one fresh process took, and its stdout (it must exit 0)."""
    began = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - began
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    return elapsed, done.stdout


def rounds(named: dict[str, list[str]], env: dict[str, str], pairs: int) -> dict[str, list[float]]:
    """Seconds of each case per round, after one untimed round; the order rotates."""
    names = list(named)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for i in range(pairs + 1):
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            elapsed, out = once(named[name], env)
            if name == COMMAND and i == 0 and not json.loads(out):
                raise RuntimeError(f"{name} listed none of the runs stored for it")
            if i > 0:
                samples[name].append(elapsed)
    return samples


def loads_celery(env: dict[str, str]) -> list[str]:
    """Which of Celery and kombu the command imports (it should import neither)."""
    out = once([sys.executable, "-c", PROBE], env)[1]
    return list(json.loads(out.splitlines()[-1]))


def report(samples: dict[str, list[float]], runs: int, source: str, loaded: list[str]) -> None:
    """Print the table and the verdict."""
    base = samples[BASELINE]
    print(f"## Cold CLI: `{COMMAND}` ({runs} runs stored) against its libraries' imports\n")
    rows: list[list[object]] = []
    ratios: dict[str, float] = {}
    for name, times in samples.items():
        ratios[name] = statistics.median(t / b for t, b in zip(times, base, strict=True))
        rows.append(
            [
                f"`{name}`",
                f"{statistics.median(times) * 1000:.0f}",
                f"{min(times) * 1000:.0f}",
                f"{max(times) * 1000:.0f}",
                f"{ratios[name]:.2f}x",
            ]
        )
    print_table(["case", "median ms", "min ms", "max ms", "ratio vs baseline"], rows)
    ratio = ratios[COMMAND]
    verdict = "PASS" if ratio <= TARGET else "FAIL"
    print(f"target: `{COMMAND}` within {TARGET}x of `{BASELINE}`: {ratio:.2f}x  {verdict}")
    print(f"imports Celery or kombu: {', '.join(loaded) if loaded else 'neither'}")
    print()
    print("notes:")
    print(
        f"- {len(base)} rounds after one untimed, the cases' order rotating; a ratio is the "
        "median over the rounds of case / baseline in the same round"
    )
    print("- bytecode caches written by the untimed round (PYTHONDONTWRITEBYTECODE unset)")
    print(f"- every python -c case imports as the command does: {GC_TREATMENT}")
    print(f"- redis via {source}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--pairs", type=int, default=15, help="timed rounds (each times every case once)"
    )
    parser.add_argument("--runs", type=int, default=20, help="runs stored for the listing")
    parser.add_argument(
        "--plain-gc", action="store_true", help="add the baseline with the GC left on"
    )
    parser.add_argument(
        "--url", help="Redis URL (default: $RUNNER_BENCH_REDIS_URL, local DB 15, else embedded)"
    )
    args = parser.parse_args(argv)
    if args.pairs < 1 or args.runs < 1:
        parser.error("--pairs and --runs must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; 0 when it ran (whatever the verdict), 1 when Redis is unreachable."""
    args = parse_args(argv)
    started = time.perf_counter()
    prefix = f"bench-cli-{uuid.uuid4().hex[:8]}"
    try:
        with bench_redis(args.url) as target:
            admin = target.client()
            try:
                seed(target.url, prefix, args.runs)
                env = case_env(target.url, prefix)
                loaded = loads_celery(env)
                samples = rounds(cases(args.plain_gc), env, args.pairs)
            finally:
                removed = delete_prefix(admin, prefix + ":")
                left = count_keys(admin, prefix + ":")
                admin.close()
            report(samples, args.runs, target.source, loaded)
            print(f"- cleanup: removed {removed} keys under {prefix}:, {left} left")
    except StoreUnavailable as exc:
        print(f"cli_cold: {exc}", file=sys.stderr)
        return 1
    print(f"- elapsed: {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
