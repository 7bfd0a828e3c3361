"""Token-level attainment as the worker counts it: output token i (1-based, per choice) is on time iff emitted by
the TTFT deadline + (i - 1) * the TPOT SLO; a request that ends with stop or length reports its count."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
from pydantic import ValidationError

from contracts import RequestOutcome
from worker.core.streaming import RequestTrack, emissions_for

DEADLINE_MS = 1000.0
TPOT_MS = 10.0


@dataclass
class Out:
    """The fields of an engine output that emissions_for reads."""

    token_ids: tuple[int, ...] = (7,)
    is_finished: bool = False
    finish_reason: str | None = None
    index: int = 0
    request_id: str = "r"
    text: str = "x"
    logprobs: tuple[float, ...] | None = None
    num_prompt_tokens: int = 3
    num_output_tokens: int = 0
    num_cached_tokens: int = 0


def _track(deadline_ms: float | None = DEADLINE_MS, **kw) -> RequestTrack:
    return RequestTrack(request_id="r", model="m", instance_id="i-1", reply_subject="janus.reply.g.r",
                        num_prompt_tokens=3, started_unix_ms=900.0, ttft_deadline_unix_ms=deadline_ms,
                        tpot_slo_ms=TPOT_MS, **kw)


def _emit(track: RequestTrack, at_ms: float, **out):
    return emissions_for(track, Out(**out), worker_id="w-1", now_unix_ms=at_ms)


def test_each_token_is_on_time_by_its_own_due_time():
    track = _track()
    _emit(track, 1000.0)  # token 1, due 1000: on time (the deadline itself counts)
    _emit(track, 1015.0)  # token 2, due 1010: late
    _emit(track, 1019.0)  # token 3, due 1020: on time again (a late token does not make the later ones late)
    emission = _emit(track, 1040.0, is_finished=True, finish_reason="length")  # token 4, due 1030: late
    assert track.num_on_time_tokens == 2
    assert emission.outcome == RequestOutcome(request_id="r", model="m", worker_id="w-1", instance_id="i-1",
                                              num_output_tokens=4, num_on_time_tokens=2, finish_reason="length")


def test_a_chunk_of_several_tokens_counts_each_by_its_index():
    track = _track()
    _emit(track, 990.0)
    # tokens 2, 3, 4 at once at 1015: due 1010 (late), 1020 and 1030 (on time)
    emission = _emit(track, 1015.0, token_ids=(1, 2, 3), is_finished=True, finish_reason="stop")
    assert (emission.outcome.num_output_tokens, emission.outcome.num_on_time_tokens) == (4, 3)


def test_each_choice_has_its_own_due_times():
    track = _track()
    for at_ms in (1000.0, 1010.0):  # n = 2: each step emits one token of each choice
        _emit(track, at_ms, index=0)
        _emit(track, at_ms, index=1)
    emission = _emit(track, 1020.0, index=1, is_finished=True, finish_reason="stop")
    # with one count over both choices, tokens 2 to 5 would be due at 1010..1040 and token 2 (at 1000) early,
    # tokens 3 and 4 (at 1010) fine; per choice every token is on time
    assert (emission.outcome.num_output_tokens, emission.outcome.num_on_time_tokens) == (5, 5)


def test_a_track_that_starts_past_its_first_token_goes_on_from_there():
    # a P/D decode instance: the prefill instance emitted token 1 (on time)
    track = _track(next_seq=1, num_output_tokens=1, first_token_unix_ms=995.0, num_on_time_tokens=1)
    _emit(track, 1012.0)  # token 2, due 1010: late
    emission = _emit(track, 1020.0, is_finished=True, finish_reason="stop")  # token 3, due 1020
    assert (emission.outcome.num_output_tokens, emission.outcome.num_on_time_tokens) == (3, 2)


@pytest.mark.parametrize("finish_reason", ["stop", "length"])
def test_the_outcome_comes_once_when_the_request_ends_normally(finish_reason):
    track = _track()
    assert _emit(track, 1000.0).outcome is None  # still running
    emission = _emit(track, 1005.0, is_finished=True, finish_reason=finish_reason)
    assert emission.outcome is not None and emission.outcome.finish_reason == finish_reason
    assert emission.to_client[-1].kind == "done"


@pytest.mark.parametrize("finish_reason,cancelled", [("abort", True), ("abort", False), ("error", False)])
def test_no_outcome_for_a_request_that_failed_or_was_cancelled(finish_reason, cancelled):
    track = _track()
    track.is_cancelled = cancelled
    _emit(track, 1000.0)
    emission = _emit(track, 1005.0, token_ids=(), is_finished=True, finish_reason=finish_reason)
    assert emission.outcome is None and emission.to_client[-1].kind == "error"


def test_no_deadline_no_count_and_no_outcome():
    track = _track(deadline_ms=None)
    _emit(track, 0.0)
    emission = _emit(track, 1.0, is_finished=True, finish_reason="stop")
    assert emission.outcome is None and track.num_on_time_tokens == 0
    assert emission.to_client[-1].kind == "done"  # the client's stream is unchanged


def test_an_outcome_cannot_claim_more_on_time_tokens_than_it_had():
    base = dict(request_id="r", model="m", worker_id="w", instance_id="i", finish_reason="stop")
    assert RequestOutcome(**base, num_output_tokens=2, num_on_time_tokens=2).num_on_time_tokens == 2
    with pytest.raises(ValidationError):
        RequestOutcome(**base, num_output_tokens=2, num_on_time_tokens=3)
    with pytest.raises(ValidationError):
        RequestOutcome(**base, num_output_tokens=-1, num_on_time_tokens=0)
