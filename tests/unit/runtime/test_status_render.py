"""`janus status` tables fit the terminal they are printed on and never cut a cell (runtime/status.py)."""
from __future__ import annotations

import io

from runtime.status import PIPE_WIDTH_COLUMNS, render, terminal_width_columns

LONG_WORKER = "gpu-node-17.us-east-2.compute.internal-worker-0003"
LONG_MODEL = "meta-llama-3.1-8b-instruct-finetuned-support-v7"


def _snapshot() -> dict:
    return {
        "devices": [{"worker_id": LONG_WORKER, "device": "cuda:0", "device_name": "NVIDIA H200", "pages_free": 40,
                     "pages_total": 64, "fragmentation": 0.125, "pages_by_model": {LONG_MODEL: {"kv": 20, "w": 4}},
                     "age_s": 0.4}],
        "instances": [{"model": LONG_MODEL, "worker_id": LONG_WORKER, "pool": "large", "role": "mixed",
                       "state": "active", "is_ready": True, "num_waiting": 3, "num_running": 12,
                       "ttft_ms_p50": 41.5}],
        "models": [{"model": LONG_MODEL, "replicas": {"steady": 2, "elastic": 1}, "ready": 3,
                    "request_rate_rps": 12.5, "queue_depth": 3, "ttft_attainment": 0.987}],
        "plans": [],
    }


def _rendered(width_columns: int) -> str:
    out = io.StringIO()
    render(_snapshot(), out=out, width_columns=width_columns)
    return out.getvalue()


def test_a_narrow_terminal_folds_cells_instead_of_cutting_them():
    text = _rendered(70)
    assert max(len(line) for line in text.splitlines()) <= 70
    assert "…" not in text
    devices = text.split("instances")[0]
    assert _column(devices, 0) == LONG_WORKER  # every character is there, wrapped inside its cell
    models = text.split("models")[-1]
    assert _column(models, 0) == LONG_MODEL


def _column(table: str, index: int) -> str:
    """One column's body cells, read top to bottom and joined (a folded cell continues on the next line)."""
    cells = [line.split("│")[1:-1][index].strip() for line in table.splitlines() if line.startswith("│")]
    return "".join(cells)


def test_a_wide_terminal_keeps_each_row_on_one_line():
    text = _rendered(200)
    assert max(len(line) for line in text.splitlines()) <= 200
    assert any(LONG_WORKER in line and LONG_MODEL in line for line in text.splitlines())  # the instances row
    assert "98.7%" in text and "41.5" in text


def test_the_width_is_the_terminals_and_piped_output_is_not_cut_at_80(monkeypatch):
    monkeypatch.setenv("COLUMNS", "132")
    assert terminal_width_columns() == 132
    monkeypatch.delenv("COLUMNS")
    # pytest captures stdout: no terminal to measure, as when `janus status | less`
    assert terminal_width_columns() == PIPE_WIDTH_COLUMNS > 80
