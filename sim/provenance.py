"""Which code a simulated result came from: the tree the `sim` package was imported from, its commit, and the files
changed in it since that commit.

A simulated figure counts only for the code that serves (docs/sim.md), so `janus sim` names its code in the run's
header and in summary.json, and `--compare` says when two runs ran different code. It matters most where it is least
visible: through the editable install `make setup` makes, a copy of the tree run with that environment's `janus`
imports the install's checkout, not the copy (unless PYTHONPATH names the copy), and a run started while that
checkout is being edited runs the edit.
"""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import TypedDict

GIT_TIMEOUT_S = 10.0
NUM_FILES_NAMED = 3  # in the one-line description; summary.json keeps them all


class CodeProvenance(TypedDict):
    source_dir: str  # the folder holding the imported `sim` package
    commit: str | None  # None: not a git checkout (an installed wheel, a copy), or no git
    changed_files: list[str]  # files changed since `commit` (and new .py files), as `git status` names them


def code_provenance(source_dir: Path | None = None) -> CodeProvenance:
    """The provenance of the code under `source_dir` (default: the tree this module was imported from)."""
    root = (source_dir or Path(__file__).resolve().parent.parent).resolve()

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                                  timeout=GIT_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout if done.returncode == 0 else None

    # Only a checkout whose top is this folder names our code: a copy inside some other repository must not borrow
    # that repository's commit.
    top = git("rev-parse", "--show-toplevel")
    if top is None or Path(top.strip()).resolve() != root:
        return CodeProvenance(source_dir=str(root), commit=None, changed_files=[])
    commit = (git("rev-parse", "HEAD") or "").strip() or None
    status = git("status", "--porcelain", "--untracked-files=all") or ""
    # every tracked file changed, and new Python files (a module not yet added runs all the same); other untracked
    # files (notes, outputs) are not code
    changed = sorted(line[3:] for line in status.splitlines()
                     if len(line) > 3 and (not line.startswith("??") or line.endswith(".py")))
    return CodeProvenance(source_dir=str(root), commit=commit, changed_files=changed)


def describe(code: CodeProvenance) -> str:
    """One line: `c708f9c (2 files changed: sim/cli.py, sim/report.py) in <dir>`."""
    if code["commit"] is None:
        return f"not a git checkout, in {code['source_dir']}"
    changed = code["changed_files"]
    if not changed:
        edits = "no changes"
    else:
        named = ", ".join(changed[:NUM_FILES_NAMED]) + (", ..." if len(changed) > NUM_FILES_NAMED else "")
        edits = f"{len(changed)} file{'s' if len(changed) != 1 else ''} changed: {named}"
    return f"{code['commit'][:12]} ({edits}) in {code['source_dir']}"


def is_same_code(a: CodeProvenance, b: CodeProvenance) -> bool:
    """Whether two runs can be said to have run the same code: one commit, no changes in either. Two runs with
    changes, or outside a checkout, cannot be told apart and are not."""
    return a["commit"] is not None and a["commit"] == b["commit"] and not a["changed_files"] \
        and not b["changed_files"]
