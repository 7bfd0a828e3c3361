"""The load grid profiles are taken over: token rates x length mixes x replica counts."""
from __future__ import annotations

from dataclasses import dataclass
from itertools import product

from contracts import LoadFeatures

# Output lengths of a mix without samples are log-normal with this CV around its mean (workload.py).
OUTPUT_LEN_CV = 0.5


@dataclass(frozen=True)
class LengthMix:
    """Prompt lengths log-normal with this mean and coefficient of variation; output lengths with this mean. Or,
    with `samples`, (prompt, output) pairs drawn from those seen (telemetry), the means and CV describing them."""

    name: str
    input_len_mean: float
    input_len_cv: float
    output_len_mean: float
    samples: tuple[tuple[int, int], ...] = ()

    @classmethod
    def of_samples(cls, name: str, samples: tuple[tuple[int, int], ...]) -> "LengthMix":
        if not samples:
            raise ValueError(f"length mix {name!r}: no samples")
        prompts = [p for p, _ in samples]
        mean = sum(prompts) / len(prompts)
        std = (sum((p - mean) ** 2 for p in prompts) / len(prompts)) ** 0.5
        return cls(name, mean, std / mean if mean > 0 else 0.0, sum(o for _, o in samples) / len(samples),
                   tuple(samples))

    @property
    def input_len_var(self) -> float:
        return (self.input_len_cv * self.input_len_mean) ** 2

    @property
    def output_len_var(self) -> float:
        """The samples' output-length variance, else that of the log-normal the workload draws (OUTPUT_LEN_CV)."""
        if not self.samples:
            return (OUTPUT_LEN_CV * self.output_len_mean) ** 2
        return sum((o - self.output_len_mean) ** 2 for _, o in self.samples) / len(self.samples)


@dataclass(frozen=True)
class GridPoint:
    rate_rps: float
    mix: LengthMix
    num_replicas: int

    @property
    def features(self) -> LoadFeatures:
        """The whole model's load (all replicas together)."""
        tokens_per_request = self.mix.input_len_mean + self.mix.output_len_mean
        return LoadFeatures(token_rate_tps=self.rate_rps * tokens_per_request, input_len_mean=self.mix.input_len_mean,
                            input_len_var=self.mix.input_len_var, output_len_mean=self.mix.output_len_mean,
                            output_len_var=self.mix.output_len_var)


def load_grid(rates_rps: list[float], mixes: list[LengthMix], replicas: list[int]) -> list[GridPoint]:
    if not rates_rps or not mixes or not replicas:
        raise ValueError("a grid needs at least one rate, one length mix and one replica count")
    if min(rates_rps) <= 0 or min(replicas) < 1:
        raise ValueError("rates must be > 0 and replica counts >= 1")
    return [GridPoint(r, mix, m) for r, mix, m in product(rates_rps, mixes, replicas)]
