"""``runner dev``'s reload: which of the project's files its workers run, and when one changes.

The files are found as a worker finds them: a fresh interpreter, in the project folder and
with the workers' environment, imports the flow modules and lists every module it loaded;
those under the project folder and outside the interpreter's own libraries (the standard
library, site-packages, a ``.venv`` inside the project) are the project's. A fresh process
rather than ``runner dev``'s own: it shows what a new worker would import, and an edit that
no longer imports is caught here, before any worker is stopped.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from runner.errors import FlowImportError

PROBE = """\
import importlib, json, sys
try:
    for name in sys.argv[1:]:
        importlib.import_module(name)
except Exception as exc:
    print(" ".join(f"{type(exc).__name__}: {exc}".split()), file=sys.stderr)
    raise SystemExit(1) from None
print(json.dumps([getattr(m, "__file__", None) for m in list(sys.modules.values())]))
"""
"""Run with ``python -c PROBE MODULE...``: the loaded modules' files as JSON, or one line on
stderr saying why an import failed."""

PROBE_TIMEOUT = 60.0
"""Seconds the flow modules get to import in the probe."""
SETTLE_MS = 300
"""A burst of changes (an editor saving several files, a ``git checkout``) is one change
once no file has changed for this long..."""
MAX_BURST_MS = 2_000
"""...or once it has lasted this long."""


def _library_dirs() -> list[Path]:
    # Where this interpreter's own libraries live: never the project's code, even when the
    # virtualenv sits inside the project folder.
    paths = sysconfig.get_paths()
    found = [paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths]
    found += site.getsitepackages()
    if site.ENABLE_USER_SITE:
        found.append(site.getusersitepackages())
    return [Path(os.path.realpath(p)) for p in found]


def project_files(modules: list[str], project: Path, env: Mapping[str, str]) -> frozenset[Path]:
    """The files under ``project`` that importing ``modules`` loads, as a worker started
    there with ``env`` would; :class:`FlowImportError` (one line: the reason) if one fails."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", PROBE, *modules],
            cwd=project,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        late = f"importing {', '.join(modules)} took more than {PROBE_TIMEOUT:g}s"
        raise FlowImportError(late, modules=modules) from None
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"the import exited with {done.returncode}"]
        raise FlowImportError(lines[-1], modules=modules)
    root = Path(os.path.realpath(project))
    libraries = _library_dirs()
    loaded = json.loads(done.stdout.splitlines()[-1])  # after whatever the modules printed
    files = {Path(os.path.realpath(f)) for f in loaded if f and os.path.isabs(f)}
    return frozenset(
        f
        for f in files
        if f.is_relative_to(root) and not any(f.is_relative_to(lib) for lib in libraries)
    )


class Watch:
    """The project files the workers of ``runner dev`` run (:func:`project_files`), and
    their changes."""

    def __init__(self, modules: list[str], project: Path, env: Mapping[str, str]) -> None:
        """Find the files now (:class:`FlowImportError` if the modules do not import)."""
        self.modules, self.project, self.env = modules, project, env
        self.files = project_files(modules, project, env)

    def refresh(self) -> None:
        """Find the files again, after a change (the modules may import other files now);
        :class:`FlowImportError` if they no longer import, the files watched unchanged."""
        self.files = project_files(self.modules, self.project, self.env)

    def changes(self, every: float) -> Iterator[list[Path]]:
        """Yield the watched files that changed, sorted, one burst at a time; an empty list
        after ``every`` seconds without a change, so the caller can do its other rounds."""
        # Imported here: ~14 ms that every other `runner` command would pay at start-up.
        import watchfiles

        while True:
            folders = {f.parent for f in self.files}
            if not folders:  # the modules are installed elsewhere: nothing here to watch
                time.sleep(every)
                yield []
                continue
            # Folders, not files: an editor that saves by writing a new file and renaming
            # it over the old one replaces the very file a watch on the file would follow.
            for raw in watchfiles.watch(
                *sorted(folders),
                watch_filter=lambda _change, path: Path(path) in self.files,
                recursive=False,
                step=SETTLE_MS,
                debounce=MAX_BURST_MS,
                rust_timeout=int(every * 1000),
                yield_on_timeout=True,
            ):
                yield sorted({Path(path) for _change, path in raw})
                if {f.parent for f in self.files} != folders:
                    break  # a refresh moved the files: watch their folders instead
