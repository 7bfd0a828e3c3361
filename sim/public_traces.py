"""Loaders for the public traces in `shared/traces/` (see its README): each becomes a `Trace`, open-loop, with
app identity (where the trace has one), order, lengths and relative timing kept."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from .paths import traces_dir
from .trace import Trace

AZURE_CONV = "azure2023_conv.csv"
MOONCAKE_CONV = "mooncake_fast25_conversation.jsonl"
PRISM_ARENA = "prism_vtc_arena_trace.csv"


def load_azure(path: Path | None = None) -> Trace:
    """Azure LLM inference (conversation): one service, wall-clock timestamps with 100 ns digits."""
    path = path or traces_dir() / AZURE_CONV
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    if not rows:
        raise ValueError(f"{path}: no rows")
    stamps = np.array([r["TIMESTAMP"].strip().replace(" ", "T")[:26] for r in rows], dtype="datetime64[us]")
    arrival_s = (stamps - stamps.min()).astype(np.float64) / 1e6
    return Trace.build(arrival_s, np.zeros(len(rows)), [int(r["ContextTokens"]) for r in rows],
                       [int(r["GeneratedTokens"]) for r in rows], ("azure-conv",), source="azure2023_conv")


def load_mooncake(path: Path | None = None) -> Trace:
    """Kimi conversation trace (Mooncake): timestamps in ms from start (quantised to ~3 s in the file)."""
    path = path or traces_dir() / MOONCAKE_CONV
    arrival_ms, inputs, outputs = [], [], []
    with open(path) as handle:
        for line in handle:
            if line.strip():
                row = json.loads(line)
                arrival_ms.append(float(row["timestamp"]))
                inputs.append(int(row["input_length"]))
                outputs.append(int(row["output_length"]))
    return Trace.build(np.array(arrival_ms) / 1e3, np.zeros(len(inputs)), inputs, outputs, ("mooncake-conv",),
                       source="mooncake_fast25_conversation")


def load_prism_arena(path: Path | None = None) -> Trace:
    """Chatbot Arena multi-model trace (27 models): each model id becomes an app, in order of first appearance."""
    path = path or traces_dir() / PRISM_ARENA
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    names: dict[str, int] = {}
    app_ids = [names.setdefault(r["model_id"], len(names)) for r in rows]
    return Trace.build([float(r["arrival_s"]) for r in rows], app_ids, [int(r["input_tokens"]) for r in rows],
                       [int(r["output_tokens"]) for r in rows], tuple(names), source="prism_vtc_arena")


LOADERS = {"azure": load_azure, "mooncake": load_mooncake, "arena": load_prism_arena}


def load_public(name: str) -> Trace:
    """A public trace by short name: azure, mooncake, arena (servegen is generated: see sim.servegen)."""
    try:
        return LOADERS[name]()
    except KeyError:
        raise ValueError(f"unknown trace {name!r}; known: {sorted(LOADERS)} and servegen") from None
