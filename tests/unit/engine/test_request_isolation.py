"""One bad request fails alone, on the real demo engine: parameters the engine cannot take are refused when the
request is added (the gateway refuses them first; these come from a client that skipped it), and an error while
serving one request inside step() ends that request with finish_reason "error" while the batch and the engine go
on. The worker turns such an output into a typed error for the client and a notice that keeps the dispatchers from
sending it anywhere else.

The faults inside step() are requests built with pydantic's `model_construct` (no validation), as a producer that
skipped validation would send them: the engine's own code raises on them."""
from __future__ import annotations

import threading

import pytest

from contracts import ErrorCode, RequestFailed
from contracts.requests import MAX_STOP_STRING_CHARS, SamplingParams
from worker.core.streaming import RequestTrack, emissions_for
from worker.engine import EngineConfig, LLMEngine
from worker.shell.engine_loop import EngineLoop

from .test_engine_behaviour import _run


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return LLMEngine(tiny_model_dir, config=EngineConfig())


def _ok(max_tokens: int = 6) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)


@pytest.mark.parametrize("sampling, words", [
    (SamplingParams(max_tokens=4, seed=2**64), "seed"),  # the poison seed
    (SamplingParams(max_tokens=4, seed=-1), "seed"),
    (SamplingParams(max_tokens=4, stop_token_ids=(2**63, -7)), "stop token ids"),
    (SamplingParams(max_tokens=4, stop=("x" * (MAX_STOP_STRING_CHARS + 1),)), "stop string"),
])
def test_parameters_the_engine_cannot_take_are_refused_when_added(engine, sampling, words):
    with pytest.raises(ValueError, match=words):
        engine.add_request("bad", [5, 6, 7], sampling)
    assert not engine.has_unfinished()
    engine.add_request("good", [5, 6, 7], _ok())
    assert _run(engine)["good"][-1].finish_reason == "length"


def test_a_request_failing_in_its_setup_inside_step_fails_alone(engine):
    engine.add_request("before", [5, 6, 7], _ok(8))
    # an empty stop string: StopStringMatcher raises when step() registers the request
    engine.add_request("bad", [8, 9], SamplingParams.model_construct(**{**_ok().model_dump(), "stop": ("",)}))
    engine.add_request("after", [10, 11], _ok(8))
    outs = _run(engine)
    (bad,) = outs["bad"]
    assert bad.is_finished and bad.finish_reason == "error" and "stop strings must not be empty" in bad.error
    assert bad.token_ids == ()
    for rid in ("before", "after"):
        assert outs[rid][-1].finish_reason == "length" and sum(len(o.token_ids) for o in outs[rid]) == 8
    assert engine.stats().num_kv_blocks_used == 0  # nothing of the failed request is left behind


def test_a_request_failing_on_its_token_inside_step_fails_alone(engine):
    engine.add_request("ref", [3, 4, 5], _ok(6))
    reference = [t for o in _run(engine)["ref"] for t in o.token_ids]
    engine.add_request("neighbour", [3, 4, 5], _ok(6))
    # max_tokens None: the length check on its first sampled token raises (TypeError) in step()
    engine.add_request("bad", [7, 8], SamplingParams.model_construct(**{**_ok().model_dump(), "max_tokens": None}))
    outs = _run(engine)
    assert outs["bad"][-1].finish_reason == "error" and "TypeError" in outs["bad"][-1].error
    assert [t for o in outs["neighbour"] for t in o.token_ids] == reference  # its batch mate is unchanged
    assert engine.stats().num_kv_blocks_used == 0


def test_a_handed_over_request_failing_in_its_setup_fails_alone(engine):
    blocks = engine.reserve_kv_blocks("bad-decode", 3)
    bad = SamplingParams.model_construct(**{**_ok().model_dump(), "stop": ("",)})
    engine.add_decode_request("bad-decode", [5, 6, 7], 9, bad, blocks)
    engine.add_request("good", [5, 6, 7], _ok(4))
    outs = _run(engine)
    assert outs["bad-decode"][-1].finish_reason == "error" and outs["good"][-1].finish_reason == "length"
    assert engine.stats().num_kv_blocks_used == 0  # the reserved blocks came back with the failed request


def test_the_engine_loop_keeps_the_engine_when_one_request_fails(engine):
    outputs, failures = [], []
    done = threading.Event()

    def on_outputs(instance_id, outs):
        outputs.extend(outs)
        if any(o.request_id == "good" and o.is_finished for o in outs):
            done.set()

    loop = EngineLoop(on_outputs, lambda iid, exc: failures.append(exc))
    loop.add("inst-1", engine)
    loop.start()
    try:
        engine.add_request("bad", [8, 9], SamplingParams.model_construct(**{**_ok().model_dump(), "stop": ("",)}))
        engine.add_request("good", [5, 6], _ok(4))
        loop.wake()
        assert done.wait(30.0)
    finally:
        loop.stop()
    assert failures == [] and loop.get("inst-1") is engine
    assert [o.finish_reason for o in outputs if o.request_id == "bad"] == ["error"]


def test_the_worker_sends_a_typed_error_and_tells_the_dispatchers(engine):
    engine.add_request("bad", [8, 9], SamplingParams.model_construct(**{**_ok().model_dump(), "stop": ("",)}))
    (out,) = _run(engine)["bad"]
    track = RequestTrack(request_id="bad", model="demo-tiny", instance_id="i-1", reply_subject="janus.reply.g.bad",
                         num_prompt_tokens=2, started_unix_ms=0.0)
    emission = emissions_for(track, out, worker_id="w-1", now_unix_ms=10.0)
    (event,) = emission.to_client
    assert isinstance(event, RequestFailed) and event.error.code == ErrorCode.INTERNAL
    assert "bad" in event.error.message and "stop strings must not be empty" in event.error.message
    notice = emission.prefill_done
    assert notice is not None and not notice.ok and notice.failure == "request_failed"
    assert track.is_finished
