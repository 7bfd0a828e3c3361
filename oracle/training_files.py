"""Training sets on disk: the oracle core reads and writes none (docs/architecture.md, "Layers"); the oracle service,
the profiler and the simulator's profile cache go through here."""
from __future__ import annotations

from pathlib import Path

from .core.dataset import TrainingSet


def save_training_set(training_set: TrainingSet, path: str | Path) -> None:
    Path(path).write_text(training_set.to_json())


def load_training_set(path: str | Path) -> TrainingSet:
    return TrainingSet.from_json(Path(path).read_text())
