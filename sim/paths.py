"""Where the shared data lives: $JANUS_SHARED_DIR, else the folder `shared` beside the repository root."""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def shared_dir() -> Path:
    env = os.environ.get("JANUS_SHARED_DIR")
    return Path(env) if env else REPO_ROOT.parent / "shared"


def traces_dir() -> Path:
    return shared_dir() / "traces"
