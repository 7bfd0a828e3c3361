"""From engine outputs to the stream a gateway reads: numbered chunks, one terminal event, and for the dispatchers a
prefill notice and the request's outcome (its on-time output tokens).

Pure: the shell passes the clock reading in and publishes what comes back.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from contracts import ErrorCode, ErrorInfo, PrefillDone, RequestDone, RequestFailed, RequestOutcome, TokenChunk


class EngineOutputLike(Protocol):
    request_id: str
    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[float, ...] | None
    is_finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int  # of the prompt, found in the prefix cache


@dataclass
class RequestTrack:
    """What the worker keeps of one request in flight on one of its instances."""

    request_id: str
    model: str
    instance_id: str
    reply_subject: str
    num_prompt_tokens: int
    started_unix_ms: float
    want_logprobs: bool = False
    next_seq: int = 0
    num_output_tokens: int = 0
    first_token_unix_ms: float | None = None
    span: Any = None
    is_cancelled: bool = False
    is_finished: bool = False
    extra: dict = field(default_factory=dict)
    # token-level attainment: output token i (1-based, per choice) is on time iff emitted by the TTFT deadline +
    # (i - 1) * the TPOT SLO. No deadline (None): nothing is counted and no outcome is reported.
    ttft_deadline_unix_ms: float | None = None
    tpot_slo_ms: float = 0.0
    num_on_time_tokens: int = 0
    # output tokens emitted so far per choice (n > 1: each choice's tokens have their own due times)
    num_tokens_by_choice: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.num_output_tokens and not self.num_tokens_by_choice:
            # a track that starts past its first tokens (a P/D decode instance): those were choice 0's
            self.num_tokens_by_choice[0] = self.num_output_tokens

    def take_seq(self) -> int:
        seq = self.next_seq
        self.next_seq += 1
        return seq


@dataclass
class Emission:
    """What to publish for one engine output: to the reply subject, and (once) to the dispatchers."""

    to_client: list[TokenChunk | RequestDone | RequestFailed]
    prefill_done: PrefillDone | None = None
    outcome: RequestOutcome | None = None  # it finished (stop, length) with a known deadline: its on-time tokens


def count_on_time(track: RequestTrack, index: int, num_tokens: int, now_unix_ms: float) -> int:
    """Add `num_tokens` tokens of choice `index`, all emitted at now_unix_ms, to the track; returns how many of them
    were on time (each by its own index: in a chunk of several the later ones are due later)."""
    before = track.num_tokens_by_choice.get(index, 0)
    track.num_tokens_by_choice[index] = before + num_tokens
    deadline = track.ttft_deadline_unix_ms
    if deadline is None:
        return 0
    on_time = sum(1 for k in range(before, before + num_tokens) if now_unix_ms <= deadline + k * track.tpot_slo_ms)
    track.num_on_time_tokens += on_time
    return on_time


def emissions_for(track: RequestTrack, out: EngineOutputLike, *, worker_id: str, now_unix_ms: float) -> Emission:
    events: list[TokenChunk | RequestDone | RequestFailed] = []
    prefill = None
    outcome = None
    if out.token_ids:
        if track.first_token_unix_ms is None:
            track.first_token_unix_ms = now_unix_ms
            prefill = PrefillDone(request_id=track.request_id, model=track.model, worker_id=worker_id,
                                  instance_id=track.instance_id, num_prompt_tokens=track.num_prompt_tokens,
                                  prefill_ms=max(0.0, now_unix_ms - track.started_unix_ms),
                                  first_token_unix_ms=now_unix_ms)
        track.num_output_tokens += len(out.token_ids)
        count_on_time(track, getattr(out, "index", 0), len(out.token_ids), now_unix_ms)
        top = getattr(out, "top_logprobs", None)
        choice_finish = getattr(out, "choice_finish_reason", None)
        events.append(TokenChunk(request_id=track.request_id, seq=track.take_seq(), token_ids=tuple(out.token_ids),
                                 text=out.text, emitted_unix_ms=now_unix_ms, worker_id=worker_id,
                                 logprobs=tuple(out.logprobs) if track.want_logprobs and out.logprobs else None,
                                 top_logprobs=top if track.want_logprobs and top else None,
                                 index=getattr(out, "index", 0),
                                 finish_reason=choice_finish if not out.is_finished else None))
    if out.is_finished:
        track.is_finished = True
        if out.finish_reason in ("stop", "length"):
            events.append(RequestDone(request_id=track.request_id, seq=track.take_seq(),
                                      finish_reason=out.finish_reason, num_prompt_tokens=track.num_prompt_tokens,
                                      num_output_tokens=track.num_output_tokens,
                                      first_token_unix_ms=track.first_token_unix_ms, worker_id=worker_id,
                                      instance_id=track.instance_id, num_cached_tokens=out.num_cached_tokens))
            if track.ttft_deadline_unix_ms is not None:
                outcome = RequestOutcome(request_id=track.request_id, model=track.model, worker_id=worker_id,
                                         instance_id=track.instance_id, num_output_tokens=track.num_output_tokens,
                                         num_on_time_tokens=min(track.num_on_time_tokens, track.num_output_tokens),
                                         finish_reason=out.finish_reason)
        elif out.finish_reason == "error":
            # it failed alone in the engine (the engine goes on): a typed error to the client, and before the
            # first token the dispatchers hear that it ended here and must not be dispatched again
            message = f"request {track.request_id} failed in the engine: {getattr(out, 'error', None) or 'error'}"
            events.append(failure(track, ErrorInfo(code=ErrorCode.INTERNAL, message=message)))
            if track.first_token_unix_ms is None:
                prefill = request_failed_notice(track, worker_id=worker_id, now_unix_ms=now_unix_ms)
        else:
            code = ErrorCode.CANCELLED if track.is_cancelled else ErrorCode.INSTANCE_FAILED
            events.append(failure(track, ErrorInfo(code=code, message=f"request ended: {out.finish_reason}")))
    return Emission(events, prefill, outcome)


def request_failed_notice(track: RequestTrack, *, worker_id: str, now_unix_ms: float) -> PrefillDone:
    """For the dispatchers: the request ended on this instance before its first token, with its own error."""
    return PrefillDone(request_id=track.request_id, model=track.model, worker_id=worker_id,
                       instance_id=track.instance_id, num_prompt_tokens=track.num_prompt_tokens, prefill_ms=0.0,
                       first_token_unix_ms=now_unix_ms, ok=False, failure="request_failed")


def failure(track: RequestTrack, error: ErrorInfo) -> RequestFailed:
    track.is_finished = True
    return RequestFailed(request_id=track.request_id, seq=track.take_seq(), error=error,
                         num_output_tokens=track.num_output_tokens)
