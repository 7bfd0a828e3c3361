"""A step-cost clock: what one engine step of a given shape costs on this machine at its quietest.

Why. On a shared machine the engine's CPU time per step drifts with the other tenants (cache and memory bandwidth
are shared even when the thread has a core): the same step shape took 35 ms in one minute and 53 ms in the next,
and profiles an hour apart put the knee 1.3-1.5x apart (docs/bench/oracle.md). An accelerator dedicated to its
worker runs a step of a given shape in nearly the same time every time. So the profile can advance its virtual
clocks by a cost model of the step's shape instead of by the time the step happened to take: the engine still runs
every step (batching, chunked prefill, KV blocks, preemption and the tokens are all real), only the clock is steady.

The model is linear in what a step computes (fitted with non-negative weights to the quickest of several timings
of each shape, since other tenants only ever add time):

    seconds = c0 + c1 * prefill tokens + c2 * decode tokens + c3 * decode context + c4 * prefill pairs

decode context = KV tokens the decode rows attend over; prefill pairs = sum over prefilling sequences of new tokens
x tokens attended (attention grows with the square of a prompt). Pure but for `measure_step_costs`, which drives
an engine.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from contracts import SamplingParams


@dataclass(frozen=True)
class StepShape:
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    decode_context_tokens: int = 0
    prefill_pairs: int = 0

    def features(self) -> tuple[float, float, float, float, float]:
        return (1.0, float(self.num_prefill_tokens), float(self.num_decode_tokens),
                float(self.decode_context_tokens), float(self.prefill_pairs))


class ShapeTracker:
    """The shape of the step an engine runs, read from its scheduler's sequences before and after the step.

    Keeps the sequence objects themselves, so a sequence that finishes in the step (and leaves the running list)
    still counts; one preempted in the step (its computed tokens reset) counts as nothing. Requests added since the
    last step reach the scheduler only inside `step()`: those found running afterwards started from nothing (one
    that also finished within that step goes uncounted)."""

    def __init__(self) -> None:
        self._before: dict[int, tuple[object, int]] = {}

    def before(self, engine) -> None:
        scheduler = engine.scheduler
        self._before = {id(seq): (seq, seq.num_computed_tokens) for seq in (*scheduler.running, *scheduler.waiting)}

    def after(self, engine) -> StepShape:
        seen = dict(self._before)
        for seq in engine.scheduler.running:
            seen.setdefault(id(seq), (seq, 0))
        num_prefill = num_decode = context = pairs = 0
        for seq, computed_before in seen.values():
            computed = seq.num_computed_tokens
            new = computed - computed_before
            if new == 1:
                num_decode += 1
                context += computed
            elif new > 1:
                num_prefill += new
                pairs += new * computed
        self._before = {}
        return StepShape(num_prefill, num_decode, context, pairs)


@dataclass(frozen=True)
class StepCostModel:
    coef: tuple[float, float, float, float, float]  # seconds: constant, per prefill token, per decode token, ...
    fit_median_error: float = 0.0  # relative error on the timings it was fitted to
    fit_p90_error: float = 0.0

    def seconds(self, shape: StepShape) -> float:
        return float(np.dot(self.coef, shape.features()))


def fit_step_cost(samples: Sequence[tuple[StepShape, float]]) -> StepCostModel:
    """Least relative squared error with non-negative coefficients (each term is work, none can save time)."""
    if len(samples) < 5:
        raise ValueError(f"fit_step_cost needs at least 5 timed steps, got {len(samples)}")
    from scipy.optimize import nnls

    design = np.array([shape.features() for shape, _ in samples])
    seconds = np.array([s for _, s in samples], dtype=float)
    if np.any(seconds <= 0):
        raise ValueError("fit_step_cost: step times must be > 0")
    weight = 1.0 / seconds
    coef, _ = nnls(design * weight[:, None], seconds * weight)
    error = np.abs(design @ coef - seconds) / seconds
    return StepCostModel(tuple(float(c) for c in coef), float(np.median(error)), float(np.quantile(error, 0.9)))


def measure_step_costs(engine, vocab_size: int, timer: Callable[[], float], repeats: int = 5, rounds: int = 3,
                       decode_batches: Sequence[int] = (0, 1, 4, 16, 48),
                       contexts: Sequence[int] = (64, 256, 768),
                       prefill_lens: Sequence[int] = (0, 16, 64, 256, 768, 1536)) -> list[tuple[StepShape, float]]:
    """Time steps of many shapes: `b` sequences decoding at about `c` tokens of context, plus (or alone) one new
    prompt of `p` tokens; each shape `repeats` times in a row, in `rounds` passes over all shapes, keeping the
    quickest. Repeats in a row share the machine's state of the moment; passes seconds apart may catch a quieter
    one (two profiles' single passes here put every cost 30 % apart). Leaves the engine empty."""
    if repeats < 1 or rounds < 1:
        raise ValueError("measure_step_costs: repeats and rounds must be >= 1")
    passes = [_one_pass(engine, vocab_size, timer, repeats, decode_batches, contexts, prefill_lens, f"r{n}")
              for n in range(rounds)]
    # every pass draws the same prompts (same seed), so the i-th sample of each is the same setting
    return [min(same, key=lambda sample: sample[1]) for same in zip(*passes)]


def _one_pass(engine, vocab_size: int, timer: Callable[[], float], repeats: int, decode_batches: Sequence[int],
              contexts: Sequence[int], prefill_lens: Sequence[int], tag: str) -> list[tuple[StepShape, float]]:
    rng = np.random.default_rng(0)
    tracker = ShapeTracker()
    samples: list[tuple[StepShape, float]] = []
    counter = 0

    def new_id(kind: str) -> str:
        nonlocal counter
        counter += 1
        return f"stepcost-{tag}{kind}{counter}"

    max_prompt = engine.max_model_len - 2
    for batch in decode_batches:
        for context in (contexts if batch else contexts[:1]):
            context = min(context, max_prompt - len(prefill_lens) * repeats - 4)
            decoding = [new_id("d") for _ in range(batch)]
            for rid in decoding:
                engine.add_request(rid, rng.integers(1, vocab_size, context).tolist(),
                                   SamplingParams(max_tokens=len(prefill_lens) * repeats + 4, temperature=0.0,
                                                  ignore_eos=True))
            for _ in range(batch * context // max(engine.scheduler.max_num_batched_tokens, 1) + 2):
                engine.step()  # the prompts, so that the timed steps decode them
            for prefill_len in prefill_lens:
                if batch == 0 and prefill_len == 0:
                    continue
                prefill_len = min(prefill_len, max_prompt)
                best: tuple[StepShape, float] | None = None
                for _ in range(repeats):
                    prompt_id = None
                    if prefill_len:
                        prompt_id = new_id("p")
                        engine.add_request(prompt_id, rng.integers(1, vocab_size, prefill_len).tolist(),
                                           SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
                    tracker.before(engine)
                    started = timer()
                    engine.step()
                    took = timer() - started
                    shape = tracker.after(engine)
                    if prompt_id:
                        engine.abort(prompt_id)
                    if took > 0 and (best is None or took < best[1]):
                        best = (shape, took)
                if best is not None and (best[0].num_prefill_tokens or best[0].num_decode_tokens):
                    samples.append(best)
            for rid in decoding:
                engine.abort(rid)
            while engine.has_unfinished():
                engine.step()
    return samples
