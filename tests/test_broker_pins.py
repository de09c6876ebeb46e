"""kombu and Celery are pinned on purpose: runner/distributed/broker.py uses their internals.

pyproject bounds both to the minor versions the adapter was written against, and the image
installs from ``constraints.txt``: the exact versions the tests run with, for every package
``pip install .`` brings. ``make test-latest`` tries the newest releases before a bound moves.
"""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from runner.distributed import broker

ROOT = Path(__file__).resolve().parents[1]


def _requirements() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(raw) for raw in project["dependencies"]]
    return {canonicalize_name(r.name): r for r in reqs}


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version
    return pins


def _runtime_closure() -> dict[str, str]:
    """Name -> installed version of everything ``pip install .`` installs (no extras)."""
    found: dict[str, str] = {}

    def walk(name: str, extras: frozenset[str]) -> None:
        for raw in metadata.distribution(name).requires or []:
            req = Requirement(raw)
            wanted = extras or frozenset({""})
            if req.marker and not any(req.marker.evaluate({"extra": e}) for e in wanted):
                continue
            try:
                version = metadata.version(req.name)
            except metadata.PackageNotFoundError:
                continue
            key = canonicalize_name(req.name)
            new = key not in found
            found[key] = version
            if new or req.extras:
                walk(req.name, frozenset(req.extras))

    walk("celery-flows", frozenset())
    return found


def test_kombu_and_celery_are_bounded_to_the_minors_the_adapter_was_written_against() -> None:
    requirements = _requirements()
    for name, written in broker.WRITTEN_AGAINST.items():
        spec, version = requirements[name].specifier, Version(written)
        assert version in spec, (name, str(spec))
        assert Version(f"{version.major}.{version.minor + 1}") not in spec, (name, str(spec))
        installed = Version(metadata.version(name))
        assert (installed.major, installed.minor) == (version.major, version.minor)


def test_the_image_installs_the_versions_the_tests_run_with() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text().splitlines()
    copies = [line.split() for line in dockerfile if line.startswith("COPY ")]
    assert any("constraints.txt" in words[1:-1] for words in copies)
    installs = [line for line in dockerfile if line.startswith("RUN pip install")]
    assert installs and all("-c constraints.txt" in line for line in installs)

    pins, closure = _pins(), _runtime_closure()
    missing = sorted(set(closure) - set(pins))
    assert not missing, "add to constraints.txt:\n" + "\n".join(
        f"{name}=={closure[name]}" for name in missing
    )
    for name in broker.WRITTEN_AGAINST:  # whose internals are used: exactly the tested ones
        assert pins[name] == closure[name], (name, pins[name], closure[name])
    for name, requirement in _requirements().items():
        if requirement.marker is None or requirement.marker.evaluate():
            assert Version(pins[name]) in requirement.specifier, (name, pins[name])
