"""How fast this machine runs the engine now, against how fast it ran it at its quietest.

On a shared machine the engine's CPU time per step drifts with what the other tenants do (cache and memory
bandwidth are shared even when the thread has a core): profiles made an hour apart put the same model's knee 1.3-1.5x
apart (docs/bench/oracle.md). The probe times one fixed engine step on an engine of its own (so it never touches
the replicas' caches or batches), a few times, and takes the median. `factor()` is the quietest time seen at
calibration over the time now: a step measured now, times the factor, is what it would have taken on the quiet
machine. The harness scales each grid point's clock by the factor measured just before the point."""
from __future__ import annotations

import statistics
from typing import Callable

import numpy as np

from contracts import SamplingParams


class SpeedProbe:
    def __init__(self, engine, vocab_size: int, timer: Callable[[], float], prompt_len: int = 128,
                 repeats: int = 5) -> None:
        if prompt_len < 1 or repeats < 1:
            raise ValueError("SpeedProbe: prompt_len and repeats must be >= 1")
        self.engine = engine
        self.timer = timer
        self.repeats = repeats
        self.prompt = np.random.default_rng(7).integers(1, vocab_size, prompt_len).tolist()
        self.reference_s: float | None = None
        self._count = 0

    def _one_step_s(self) -> float:
        self._count += 1
        self.engine.add_request(f"probe-{self._count}", self.prompt,
                                SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
        started = self.timer()
        self.engine.step()
        took = self.timer() - started
        while self.engine.has_unfinished():
            self.engine.step()
        return took

    def sample_s(self) -> float:
        """The median time of the probe step now."""
        return statistics.median(self._one_step_s() for _ in range(self.repeats))

    def calibrate(self, num_samples: int = 15) -> float:
        """The reference: the quickest of `num_samples` medians (the machine at its quietest meanwhile)."""
        self._one_step_s()  # warm-up
        self.reference_s = min(self.sample_s() for _ in range(num_samples))
        return self.reference_s

    def factor(self) -> float:
        """Quiet time over time now (<= 1 while the machine is slower than at its quietest)."""
        if self.reference_s is None:
            raise RuntimeError("SpeedProbe.factor before calibrate")
        return self.reference_s / self.sample_s()
