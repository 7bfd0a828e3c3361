"""The oracle's Prometheus series: per model and GP kind, where answers come from, training points, fits and their
age; per model, the error of its attainment predictions against the windows the dispatchers measure
(docs/oracle.md, "The oracle reports itself"). Set from oracle.core.fitlog / oracle.core.drift snapshots."""
from __future__ import annotations

import time

from runtime.metrics import counter, gauge

from .core.drift import DriftSummary, WindowScore
from .core.fitlog import GPStatus

SOURCES = ("gp", "roofline")

SOURCE = gauge("janus_oracle_source", "1 for where the model's answers of this kind come from now: a fitted GP (gp) "
               "or the roofline fallback (roofline); 0 for the other", ("model", "kind", "source"))
TRAINING_POINTS = gauge("janus_oracle_training_points", "points the answering GP was fitted on (0: the roofline "
                        "answers)", ("model", "kind"))
SAMPLES = gauge("janus_oracle_samples", "samples held for the next fit: training sets and learnt windows",
                ("model", "kind"))
LAST_FIT = gauge("janus_oracle_last_fit_unix_seconds", "when the answering GP's fit ended (unix seconds)",
                 ("model", "kind"))
FIT_AGE = gauge("janus_oracle_fit_age_seconds", "seconds since the answering GP's fit ended", ("model", "kind"))
REFITS = counter("janus_oracle_refits_total", "GP fits that succeeded (the first, from the training sets, included)",
                 ("model", "kind"))
REFIT_FAILURES = counter("janus_oracle_refit_failures_total", "GP fits that failed (the previous model kept serving)",
                         ("model", "kind"))

_VS = ("predicted token-level attainment (the oracle's elasticity mean for the window's features and serving "
       "replicas, predicted before the window is learnt) vs the window's measured TTFT attainment (the only "
       "attainment windows carry: the figure mixes the oracle's error with the gap between the two measures)")
WINDOWS_SCORED = counter("janus_oracle_windows_scored_total", "load windows whose attainment the oracle predicted "
                         "before learning from them, by what answered", ("model", "source"))
ABS_ERROR = gauge("janus_oracle_attainment_abs_error", f"rolling mean absolute error, {_VS}", ("model",))
BIAS = gauge("janus_oracle_attainment_bias", f"rolling mean of predicted - measured (> 0: optimistic), {_VS}",
             ("model",))
COVERAGE = gauge("janus_oracle_attainment_coverage", f"rolling share of windows measured within predicted mean "
                 f"+- k std (oracle.drift_k_sigma, 2 by default), {_VS}", ("model",))
ERROR_WINDOWS = gauge("janus_oracle_attainment_error_windows", "windows in the rolling error figures", ("model",))
ABS_ERROR_CURRENT = gauge("janus_oracle_attainment_abs_error_current_fit", f"mean absolute error over the rolling "
                          f"windows the answering model predicted (since its fit), {_VS}", ("model",))
PREDICTED = gauge("janus_oracle_attainment_predicted", "the last scored window's predicted token-level attainment",
                  ("model",))
MEASURED = gauge("janus_oracle_attainment_measured", "the last scored window's measured TTFT attainment", ("model",))


def observe_status(rows: list[GPStatus]) -> None:
    """Set the per (model, kind) series from fitlog.FitLog.status (times in unix seconds)."""
    for row in rows:
        labels = (row.model, row.kind)
        for source in SOURCES:
            SOURCE.labels(*labels, source).set(1.0 if row.source == source else 0.0)
        TRAINING_POINTS.labels(*labels).set(row.num_points)
        SAMPLES.labels(*labels).set(row.num_samples)
        if row.last_fit_s is not None:
            LAST_FIT.labels(*labels).set(row.last_fit_s)
            last = row.last_fit_s
            FIT_AGE.labels(*labels).set_function(lambda last=last: max(time.time() - last, 0.0))
        # counters show up at 0 before the first fit, so a rate() has a start
        REFITS.labels(*labels)
        REFIT_FAILURES.labels(*labels)


def observe_refit(model: str, kind: str, is_ok: bool) -> None:
    (REFITS if is_ok else REFIT_FAILURES).labels(model, kind).inc()


def observe_score(score: WindowScore, summary: DriftSummary) -> None:
    model = score.model
    WINDOWS_SCORED.labels(model, score.source).inc()
    ABS_ERROR.labels(model).set(summary.mean_abs_error)
    BIAS.labels(model).set(summary.bias)
    COVERAGE.labels(model).set(summary.coverage)
    ERROR_WINDOWS.labels(model).set(summary.num_windows)
    ABS_ERROR_CURRENT.labels(model).set(summary.mean_abs_error_current)
    PREDICTED.labels(model).set(score.predicted_mean)
    MEASURED.labels(model).set(score.measured)
