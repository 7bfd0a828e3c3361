"""What the simulated device does that a roofline leaves out.

The simulated devices time their steps with the roofline cost model (`costmodel.StepCost`) and then apply these
effects, so that the device is not the oracle's model: an oracle that reads the roofline is wrong about it by as
much as a roofline is wrong about a real device, and one that learns from profiles has something to learn. No code
outside `sim/` may read these parameters (the oracle learns what they do by profiling the simulated device, as a
deployment profiles its hardware).

Each effect is one parameter; 0 turns it off (`DeviceEffects.off()` is the bare roofline):

- `colocation_slowdown`: co-located instances on one device share its time (the executor runs them in turns) and
  also its caches and memory bandwidth: each other instance with work in the same round slows a step by this share.
- `mixed_step_penalty`: a chunked-prefill step that also decodes costs this share more than the roofline's sum of
  its parts (two kernels' worth of launches and worse occupancy for the attention of mixed lengths).
- `small_batch_penalty`: a decode step at batch 1 costs this share more than the roofline says, falling linearly to
  0 at batch `small_batch_knee` (small batches do not fill the device; the roofline's efficiencies are its
  average).
- `jitter_rel_std`: each step's time varies by this relative standard deviation (a log-normal factor of mean 1);
  for a run of n identical steps the executor draws the run's mean factor (std / sqrt(n)).
- `fork_source_slowdown`: an instance that is being forked from runs this share slower while the copy lasts (the
  paper bounds it at 5.7 %).

The values are documented in docs/sim.md with how each was set (calibrated against the real engine on this CPU
where that is possible: `python -m sim.calibrate --effects`)."""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class DeviceEffects:
    colocation_slowdown: float = 0.06
    mixed_step_penalty: float = 0.08
    small_batch_penalty: float = 0.25
    small_batch_knee: int = 16
    jitter_rel_std: float = 0.05
    fork_source_slowdown: float = 0.057
    seed: int = 0

    @classmethod
    def off(cls) -> "DeviceEffects":
        return cls(colocation_slowdown=0.0, mixed_step_penalty=0.0, small_batch_penalty=0.0, jitter_rel_std=0.0,
                   fork_source_slowdown=0.0)

    @property
    def is_off(self) -> bool:
        return all(getattr(self, f.name) == 0 for f in fields(self)
                   if f.name not in ("small_batch_knee", "seed"))

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class StepEffects:
    """Applies `DeviceEffects` to one executor's steps (its own seeded random stream: runs are reproducible)."""

    __slots__ = ("effects", "_rng", "_sigma")

    def __init__(self, effects: DeviceEffects, stream: str):
        self.effects = effects
        self._rng = random.Random(f"{effects.seed}/{stream}")
        self._sigma = math.sqrt(math.log1p(effects.jitter_rel_std ** 2)) if effects.jitter_rel_std > 0 else 0.0

    def instance_step(self, step_s: float, batch_size: int, has_prefill: bool, is_fork_source: bool) -> float:
        """One instance's iteration inside a round."""
        e = self.effects
        factor = 1.0
        if has_prefill and batch_size:
            factor += e.mixed_step_penalty
        elif not has_prefill and e.small_batch_penalty and batch_size < e.small_batch_knee:
            factor += e.small_batch_penalty * (e.small_batch_knee - batch_size) / (e.small_batch_knee - 1)
        if is_fork_source:
            factor += e.fork_source_slowdown
        return step_s * factor

    def round_factor(self, num_busy_instances: int, num_rounds: int) -> float:
        """The factor on a round shared by `num_busy_instances`, for a run of `num_rounds` identical rounds."""
        factor = 1.0 + self.effects.colocation_slowdown * max(0, num_busy_instances - 1)
        if self._sigma:
            sigma = self._sigma / math.sqrt(num_rounds)
            factor *= math.exp(self._rng.gauss(-0.5 * sigma * sigma, sigma))
        return factor
