"""The oracle's knobs (frozen; defaults as the design says)."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal, get_args, get_type_hints


@dataclass(frozen=True)
class OraclePolicy:
    max_grid_replicas: int = 64  # monotone correction over m = 1..max(this, the largest m asked)
    max_train_points: int = 400  # an exact GP is O(n^3): beyond this, subsample (newest kept)
    num_train_iters: int = 40  # L-BFGS iterations
    need_floor: float = 1e-4  # needs are learnt as log(need + floor)
    attainment_target: Literal["identity", "logit"] = "logit"
    # Elasticity GP prior mean: a logistic knee in the load per replica (the GP models the residual), or constant
    elasticity_mean: Literal["logistic", "constant"] = "logistic"
    logit_clip: float = 0.001  # attainment clipped to [clip, 1 - clip] before a logit
    # Telemetry windows become training samples and due models refit (the live service and the simulated Janus
    # alike); off: the oracle answers from its profiles only, as fitted at start (`observe` learns nothing)
    learns_online: bool = True
    refit_min_new_samples: int = 16  # a model refits once it has this many samples the fit has not seen...
    refit_min_interval_s: float = 30.0  # ...and its last refit is at least this old
    max_samples_per_model: int = 5000  # online samples beyond this: the oldest telemetry goes first
    # Telemetry is learnt one window per window length of a model (the dispatchers publish a sliding window every
    # 0.5 s: consecutive ones share ~90 % of their requests, and learnt each as a sample they made the GP as sure of
    # one moment as of ten independent measurements), and only from a window with this many requests (a label of a
    # handful of requests is mostly noise, and in logits an attainment of 0 or 1 sits ~7 units from the rest)
    telemetry_spacing_windows: float = 1.0
    min_telemetry_requests: int = 20
    # ...and only from a window whose replica count held from this many window lengths before the window began to its
    # end. Replicas are added because attainment fell (a burst, a backlog) and the requests finishing just after still
    # carry the wait from before: learnt, such windows say "with more replicas, attainment was low", the GP concludes
    # replicas do not help and the scaler asks for the whole fleet (docs/oracle.md, "Learning online").
    telemetry_settle_windows: float = 1.0
    # The std of an elasticity answer's bound = mean - k * std: "latent" is the GP's uncertainty about the expected
    # attainment, what a replica count is sized for; "predictive" adds one window's label noise (the std the answer
    # reports either way, what a measured window is compared with). With the noise in the bound, a 0.99 target is
    # out of reach wherever the labels scatter by more than a point, and the scaler's saturation rule then takes
    # large counts (docs/oracle.md).
    elasticity_bound_std: Literal["latent", "predictive"] = "latent"
    # Past the lengths it was trained on (a window's mean prompt, prompt spread or mean output more than this factor
    # beyond the training set's range), an Elasticity GP answers no better than the model's roofline: it knows the
    # load per replica but not what a prompt 3x longer than any it saw does to the time to first token (docs/oracle.md,
    # "Past the profiled lengths"). 0 turns the cap off.
    length_extrapolation_factor: float = 1.25
    # How long the profiles' points run (`janus profile`, and the simulator's profiles of its devices): at least
    # `min_request_lifetimes` lifetimes of the mixes' mean answer, or of the answer in flight (mean + variance /
    # mean: a heavy-tailed mix's decode KV fills over that). "in-flight" met 0.99 on every seed of the headline with
    # the learned oracle, on 17-19 % more device-hours (docs/bench/sim.md run 48; HarnessSettings.lifetime_answer).
    profile_lifetime_answer: Literal["mean", "in-flight"] = "mean"
    # The largest replica count the simulator's profiles widen to for a kind its first minute sizes wide (powers of
    # two, oracle.profile.run.widened_replicas; `janus profile` on this CPU runs its plan's fixed counts). 64 brought
    # seed 1's learned Janus from 1.06x to 1.00-1.02x the clairvoyant's device-hours (its busiest app is sized near
    # 90 instances before telemetry: at 32 that was past the grid), but seed 2's attainment fell to 0.9871 at one
    # refit time (docs/bench/sim.md run 51).
    profile_max_replicas: int = 32
    # Past the largest replica count an Elasticity GP was trained on (profiles, then telemetry): "pooled" asks it at
    # that count and the same load per replica (a lower bound: more replicas pool their queues), "prior" lets it
    # extrapolate to its prior mean with a widening sigma. Over the headline's 3 seeds x 3 refit times, on one code
    # (docs/bench/sim.md run 54), pooled met token attainment 0.99 / worst app 0.90 / 5 % of the clairvoyant's
    # device-hours in 6 / 7 / 8 runs of 9, the prior in 7 / 6 / 6, on the same mean device-hours: pooled takes
    # seed 1 from 1.05-1.06x to 1.03-1.04x the clairvoyant (docs/oracle.md, "Past the trained counts").
    past_trained_replicas: Literal["pooled", "prior"] = "pooled"
    # How the GP's mean over m = 1..M is made non-decreasing (oracle/core/monotone.py): "isotonic" is the
    # least-squares non-decreasing fit weighted by each count's precision (1 / latent std^2), so a dip where the GP
    # is unsure (std 0.07-0.15 between counts it has data at) barely moves the counts it is sure of; "midpoint" (the
    # mean of the running max from below and the running min from above) let that dip pull every count below it
    # under the target, and the scaler's m* for the headline's biggest 32B app jumped between ~35 and ~230 at
    # the same load (docs/bench/sim.md run 57).
    monotone_mean: Literal["isotonic", "midpoint"] = "isotonic"

    # Keys of the cluster YAML's `oracle` section that are the oracle service's own settings, not policy knobs
    SERVICE_KEYS: ClassVar[frozenset[str]] = frozenset({"training_sets", "drift_windows", "drift_k_sigma"})

    @classmethod
    def from_knobs(cls, knobs: dict) -> "OraclePolicy":
        """The policy of the cluster YAML's `oracle` section (its service settings left out); ValueError naming an
        unknown key or a bad value."""
        import difflib

        names = {f.name for f in fields(cls)}
        for key in knobs:
            if key not in names and key not in cls.SERVICE_KEYS:
                close = difflib.get_close_matches(str(key), sorted(names | cls.SERVICE_KEYS), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(f"{key!r} is not an oracle knob{hint}")
        hints = get_type_hints(cls)
        for key, value in knobs.items():
            if key in names:
                _check_type(key, value, hints[key])
        return cls(**{k: v for k, v in knobs.items() if k in names})

    def __post_init__(self) -> None:
        if self.max_grid_replicas < 1 or self.max_train_points < 8 or self.num_train_iters < 1:
            raise ValueError("OraclePolicy: max_grid_replicas >= 1, max_train_points >= 8, num_train_iters >= 1")
        if self.elasticity_bound_std not in ("latent", "predictive"):
            raise ValueError("OraclePolicy: elasticity_bound_std latent or predictive, "
                             f"got {self.elasticity_bound_std!r}")
        if self.elasticity_mean not in ("logistic", "constant"):
            raise ValueError(f"OraclePolicy: elasticity_mean logistic or constant, got {self.elasticity_mean!r}")
        if self.length_extrapolation_factor != 0 and self.length_extrapolation_factor < 1:
            raise ValueError("OraclePolicy: length_extrapolation_factor >= 1 (or 0: off), "
                             f"got {self.length_extrapolation_factor!r}")
        if self.telemetry_spacing_windows < 0 or self.min_telemetry_requests < 1 or self.telemetry_settle_windows < 0:
            raise ValueError("OraclePolicy: telemetry_spacing_windows >= 0, telemetry_settle_windows >= 0 and "
                             "min_telemetry_requests >= 1")
        if self.past_trained_replicas not in ("pooled", "prior"):
            raise ValueError(f"OraclePolicy: past_trained_replicas pooled or prior, got {self.past_trained_replicas!r}")
        if self.monotone_mean not in ("isotonic", "midpoint"):
            raise ValueError(f"OraclePolicy: monotone_mean isotonic or midpoint, got {self.monotone_mean!r}")
        if self.profile_max_replicas < 1:
            raise ValueError(f"OraclePolicy: profile_max_replicas >= 1, got {self.profile_max_replicas!r}")
        if not 0 < self.logit_clip < 0.5 or self.need_floor <= 0:
            raise ValueError("OraclePolicy: 0 < logit_clip < 0.5 and need_floor > 0")


def _check_type(key: str, value: Any, hint: Any) -> None:
    """ValueError unless `value` is of the knob's type: a dataclass does not validate, and a YAML `"no"` would
    otherwise switch a bool knob on (an int passes as a float; a bool is never a number)."""
    choices = get_args(hint)
    if choices:  # a Literal
        if value not in choices:
            raise ValueError(f"{key}: one of {', '.join(map(repr, choices))}, got {value!r}")
        return
    accepted = {bool: (bool,), int: (int,), float: (int, float)}.get(hint, (hint,))
    if not isinstance(value, accepted) or (hint is not bool and isinstance(value, bool)):
        raise ValueError(f"{key}: expected {hint.__name__}, got {value!r}")
