"""Per-request state of a run, as plain Python lists indexed by trace row (scalar list access is several times
faster than numpy scalar access, and the event loop touches one request at a time)."""
from __future__ import annotations

import numpy as np

from .metrics import Outcomes
from .trace import Trace


class RequestTable:
    """The trace's columns plus each request's SLOs (from its app) and what happened to it."""

    def __init__(self, trace: Trace, ttft_slo_s_by_app, tpot_slo_s_by_app):
        ttft_by_app = np.asarray(ttft_slo_s_by_app, dtype=np.float64)
        tpot_by_app = np.asarray(tpot_slo_s_by_app, dtype=np.float64)
        if len(ttft_by_app) != trace.num_apps or len(tpot_by_app) != trace.num_apps:
            raise ValueError("one TTFT and one TPOT SLO per app")
        self.trace = trace
        self.arrival_s = trace.arrival_s.tolist()
        self.app = trace.app_ids.tolist()
        self.input_tokens = trace.input_tokens.tolist()
        self.output_tokens = trace.output_tokens.tolist()
        self.ttft_slo_s = ttft_by_app[trace.app_ids].tolist()
        self.tpot_slo_s = tpot_by_app[trace.app_ids].tolist()
        n = trace.num_requests
        self.first_token_s: list[float] = [float("nan")] * n
        self.finish_s: list[float] = [float("nan")] * n
        self.num_on_time: list[int] = [0] * n
        # decode bookkeeping: round of the instance at which the request joined its batch, and the index of the
        # first step segment it can appear in
        self.join_round: list[int] = [0] * n
        self.join_seg: list[int] = [0] * n

    def outcomes(self) -> Outcomes:
        return Outcomes(np.array(self.first_token_s, dtype=np.float64), np.array(self.finish_s, dtype=np.float64),
                        np.array(self.num_on_time, dtype=np.int64))
