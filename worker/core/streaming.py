"""From engine outputs to the stream a gateway reads: numbered chunks, one terminal event, a prefill notice.

Pure: the shell passes the clock reading in and publishes what comes back.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from contracts import ErrorCode, ErrorInfo, PrefillDone, RequestDone, RequestFailed, TokenChunk


class EngineOutputLike(Protocol):
    request_id: str
    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[float, ...] | None
    is_finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int


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

    def take_seq(self) -> int:
        seq = self.next_seq
        self.next_seq += 1
        return seq


@dataclass
class Emission:
    """What to publish for one engine output: to the reply subject, and (once) to the dispatchers."""

    to_client: list[TokenChunk | RequestDone | RequestFailed]
    prefill_done: PrefillDone | None = None


def emissions_for(track: RequestTrack, out: EngineOutputLike, *, worker_id: str, now_unix_ms: float) -> Emission:
    events: list[TokenChunk | RequestDone | RequestFailed] = []
    prefill = None
    if out.token_ids:
        if track.first_token_unix_ms is None:
            track.first_token_unix_ms = now_unix_ms
            prefill = PrefillDone(request_id=track.request_id, model=track.model, worker_id=worker_id,
                                  instance_id=track.instance_id, num_prompt_tokens=track.num_prompt_tokens,
                                  prefill_ms=max(0.0, now_unix_ms - track.started_unix_ms),
                                  first_token_unix_ms=now_unix_ms)
        track.num_output_tokens += len(out.token_ids)
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
                                      instance_id=track.instance_id))
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
    return Emission(events, prefill)


def request_failed_notice(track: RequestTrack, *, worker_id: str, now_unix_ms: float) -> PrefillDone:
    """For the dispatchers: the request ended on this instance before its first token, with its own error."""
    return PrefillDone(request_id=track.request_id, model=track.model, worker_id=worker_id,
                       instance_id=track.instance_id, num_prompt_tokens=track.num_prompt_tokens, prefill_ms=0.0,
                       first_token_unix_ms=now_unix_ms, ok=False, failure="request_failed")


def failure(track: RequestTrack, error: ErrorInfo) -> RequestFailed:
    track.is_finished = True
    return RequestFailed(request_id=track.request_id, seq=track.take_seq(), error=error,
                         num_output_tokens=track.num_output_tokens)
