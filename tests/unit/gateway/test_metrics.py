"""The gateway's series a vLLM user looks for: prompt tokens, end-to-end latency from the arrival, and inter-token
latency of streamed answers only (a non-streamed answer has no gaps its client could see)."""
from __future__ import annotations

import time

from contracts import ErrorCode, ErrorInfo, GenerateRequest, RequestDone, RequestFailed, SamplingParams, TokenChunk
from gateway.metrics import InterTokenClock, observe_request
from gateway.respond import Shape, respond
from gateway.service import _Meter
from runtime.metrics import REGISTRY


def _value(name: str, model: str, tenant: str = "t") -> float:
    return REGISTRY.get_sample_value(name, {"model": model, "tenant": tenant}) or 0.0


def _request(model: str, prompt_len: int = 3, arrival_unix_ms: float | None = None) -> GenerateRequest:
    now_ms = time.time() * 1e3 if arrival_unix_ms is None else arrival_unix_ms
    return GenerateRequest(request_id=f"{model}-r", model=model, tenant="t",
                           prompt_token_ids=tuple(range(1, prompt_len + 1)), sampling=SamplingParams(max_tokens=4),
                           arrival_unix_ms=now_ms,
                           ttft_deadline_unix_ms=now_ms + 1000, tpot_slo_ms=50, reply_subject="reply")


def _chunk(seq: int) -> TokenChunk:
    return TokenChunk(request_id="r", seq=seq, token_ids=(seq + 1,), text=f"<{seq}>", emitted_unix_ms=0.0)


def _done(seq: int) -> RequestDone:
    return RequestDone(request_id="r", seq=seq, finish_reason="length", num_prompt_tokens=3, num_output_tokens=seq)


def test_prompt_tokens_count_once_a_first_token_came_and_e2e_is_observed_for_every_end():
    observe_request("pm", "t", "ok", ttft_s=0.1, last_token_s=0.3, num_tokens=3, num_prompt_tokens=7, e2e_s=0.35)
    observe_request("pm", "t", "overloaded", ttft_s=None, last_token_s=None, num_tokens=0, num_prompt_tokens=5,
                    e2e_s=0.01)  # refused before any prefill: its prompt was never processed
    assert _value("janus_gateway_prompt_tokens_total", "pm") == 7
    assert _value("janus_gateway_output_tokens_total", "pm") == 3  # vLLM's generation tokens
    assert _value("janus_gateway_e2e_request_latency_seconds_count", "pm") == 2
    assert abs(_value("janus_gateway_e2e_request_latency_seconds_sum", "pm") - 0.36) < 1e-9


def test_the_meter_times_e2e_from_the_arrival_to_the_terminal_event():
    req = _request("em", prompt_len=4, arrival_unix_ms=1_000_000.0)
    meter = _Meter.of(req, now_s=50.0, now_unix_ms=1_000_200.0)  # tokenising took 0.2 s before the submission
    meter.see(_chunk(0), 50.5)
    meter.see(_chunk(1), 50.7)
    meter.see(_done(2), 50.8)
    meter.record(req, now_s=60.0)  # the generator closed late: the request had ended at its done event
    assert abs(_value("janus_gateway_e2e_request_latency_seconds_sum", "em") - 1.0) < 1e-9
    assert _value("janus_gateway_prompt_tokens_total", "em") == 4
    assert abs(_value("janus_gateway_ttft_seconds_sum", "em") - 0.5) < 1e-9  # TTFT keeps counting from submission


def test_a_request_without_a_terminal_event_ends_when_it_is_recorded():
    req = _request("cm", arrival_unix_ms=2_000_000.0)
    meter = _Meter.of(req, now_s=10.0, now_unix_ms=2_000_000.0)
    meter.see(RequestFailed(request_id="r", seq=0, error=ErrorInfo(code=ErrorCode.TIMEOUT, message="x")), 12.0)
    meter.record(req, now_s=13.0)
    other = _Meter.of(req, now_s=10.0, now_unix_ms=2_000_000.0)
    other.status = "cancelled"  # the client went away: no terminal event
    other.record(req, now_s=11.5)
    assert _value("janus_gateway_e2e_request_latency_seconds_count", "cm") == 2
    assert abs(_value("janus_gateway_e2e_request_latency_seconds_sum", "cm") - 3.5) < 1e-9
    assert _value("janus_gateway_prompt_tokens_total", "cm") == 0  # neither got a first token


def test_the_clock_times_gaps_between_chunks_of_each_request_apart():
    clock = InterTokenClock([("im", "t"), ("im", "u")])
    clock.see(0, _chunk(0), 1.0)
    clock.see(1, _chunk(0), 1.05)  # another prompt of the batch: its own first chunk, no gap
    clock.see(0, _chunk(1), 1.2)
    clock.see(0, _chunk(2), 1.5)
    clock.see(0, _done(3), 9.0)  # not a token chunk
    assert _value("janus_gateway_inter_token_latency_seconds_count", "im") == 2
    assert abs(_value("janus_gateway_inter_token_latency_seconds_sum", "im") - 0.5) < 1e-9
    assert _value("janus_gateway_inter_token_latency_seconds_count", "im", tenant="u") == 0


class _Client:
    async def is_disconnected(self) -> bool:
        return False


def _submit(num_chunks: int):
    async def submit(request: GenerateRequest):
        for seq in range(num_chunks):
            yield _chunk(seq)
        yield _done(num_chunks)
    return submit


async def test_a_streamed_answer_observes_chunks_minus_one_gaps_and_a_non_streamed_one_none():
    shape = Shape(kind="completion", stream=True, include_usage=None)
    response = await respond(_Client(), [_request("sm")], _submit(4), shape, [lambda: None])
    body = [raw async for raw in response.body_iterator]
    assert body[-1] == b"data: [DONE]\n\n"
    assert _value("janus_gateway_inter_token_latency_seconds_count", "sm") == 3

    shape = Shape(kind="completion", stream=False, include_usage=None)
    response = await respond(_Client(), [_request("nm")], _submit(4), shape, [lambda: None])
    assert response.status_code == 200
    assert _value("janus_gateway_inter_token_latency_seconds_count", "nm") == 0
