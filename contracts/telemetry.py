"""Per-model load windows (dispatcher -> oracle, planners)."""
from __future__ import annotations

from pydantic import Field

from .base import Message


class LoadFeatures(Message):
    """What the oracle's GPs take as input (the paper's sliding-window features)."""

    token_rate_tps: float = Field(ge=0, description="prompt + output tokens per second")
    input_len_mean: float = Field(ge=0)
    input_len_var: float = Field(ge=0)
    output_len_mean: float = Field(ge=0)
    # Not a GP input (oracle/core/features.py): it prices a decode token for the P/D split. Long answers stay in a
    # decode batch longer, so the context a decoding sequence holds grows with the spread of output lengths
    # (oracle.roofline.decode_context_per_seq). 0: every answer as long as the mean.
    output_len_var: float = Field(default=0.0, ge=0)


class ModelLoadWindow(Message):
    """janus.telemetry.model.<model>, every 0.5 s over a sliding window."""

    model: str
    window_s: float = Field(gt=0)
    end_unix_ms: float
    num_requests: int = Field(ge=0)
    request_rate_rps: float = Field(ge=0)
    features: LoadFeatures
    ttft_attainment: float | None = Field(default=None, ge=0, le=1)
    # token-level attainment (the paper's measure, what profiles label): on-time output tokens over the tokens due,
    # of the requests that finished in the window (workers count them, contracts.RequestOutcome) and of those
    # rejected (every expected token late); None while none did
    token_attainment: float | None = Field(default=None, ge=0, le=1)
    num_tokens_due: int = Field(default=0, ge=0, description="output tokens behind token_attainment")
    num_rejected: int = Field(default=0, ge=0)
    num_late: int = Field(default=0, ge=0)
    queue_depth: int = Field(default=0, ge=0)
    dispatcher_id: str = ""
