"""Gateway admission: OpenAI bodies -> GenerateRequest, with clear errors for bad input."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from contracts import ErrorCode
from gateway.core.admission import Envelope, ServedModel, admit_chat, admit_completion
from gateway.core.api import ChatBody, CompletionBody
from gateway.core.errors import ApiError


@pytest.fixture(scope="module")
def model(demo_models_dir) -> ServedModel:
    from runtime.tokenizer import TextTokenizer

    tok = TextTokenizer.from_dir(demo_models_dir / "demo-tiny")
    return ServedModel(name="demo-tiny", max_model_len=64, ttft_slo_ms=500.0, tpot_slo_ms=50.0, tokenizer=tok)


ENV = Envelope(request_id="r1", tenant="t1", now_unix_ms=1_000_000.0, reply_subject="janus.reply.g.r1")


def test_completion_is_tokenised_with_deadline_and_sampling(model):
    body = CompletionBody(model="demo-tiny", prompt="hello world", max_tokens=5, temperature=0, stop=["\n"],
                          seed=7)
    (req,) = admit_completion(body, model, ENV)
    assert list(req.prompt_token_ids) == model.tokenizer.encode("hello world")
    assert req.ttft_deadline_unix_ms == 1_000_500.0 and req.tpot_slo_ms == 50.0
    assert req.sampling.max_tokens == 5 and req.sampling.temperature == 0 and req.sampling.stop == ("\n",)
    assert req.sampling.seed == 7 and req.tenant == "t1" and req.reply_subject == ENV.reply_subject


def test_chat_uses_the_chat_template_and_fills_max_tokens_to_the_context(model):
    body = ChatBody(model="demo-tiny", messages=[{"role": "user", "content": "hi"}])
    req = admit_chat(body, model, ENV)
    text = model.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    assert list(req.prompt_token_ids) == model.tokenizer.encode(text)
    assert req.sampling.max_tokens == model.max_model_len - len(req.prompt_token_ids)


def test_token_id_prompts_are_taken_as_they_are(model):
    (req,) = admit_completion(CompletionBody(model="demo-tiny", prompt=[5, 6, 7], max_tokens=2), model, ENV)
    assert req.prompt_token_ids == (5, 6, 7)


def test_a_batch_of_prompts_is_one_request_per_prompt_in_order(model):
    body = CompletionBody(model="demo-tiny", prompt=["a b", "x", "c"], max_tokens=2, n=2)
    reqs = admit_completion(body, model, ENV)
    assert [r.prompt_token_ids for r in reqs] == [tuple(model.tokenizer.encode(p)) for p in ("a b", "x", "c")]
    assert [r.request_id for r in reqs] == ["r1", "r1-p1", "r1-p2"]
    assert len({r.reply_subject for r in reqs}) == 3 and all(r.sampling.n == 2 for r in reqs)
    ids = admit_completion(CompletionBody(model="demo-tiny", prompt=[[5, 6], [7]], max_tokens=2), model, ENV)
    assert [r.prompt_token_ids for r in ids] == [(5, 6), (7,)]


def test_sampling_extensions_reach_the_engine_contract(model):
    body = CompletionBody(model="demo-tiny", prompt="x", max_tokens=4, presence_penalty=0.5, frequency_penalty=-1,
                          repetition_penalty=1.3, logit_bias={"7": 5, "3": -100}, min_p=0.1, min_tokens=2,
                          logprobs=5, top_k=-1)
    (req,) = admit_completion(body, model, ENV)
    s = req.sampling
    assert (s.presence_penalty, s.frequency_penalty, s.repetition_penalty) == (0.5, -1.0, 1.3)
    assert s.logit_bias == ((3, -100.0), (7, 5.0)) and s.min_p == 0.1 and s.min_tokens == 2
    assert s.logprobs and s.top_logprobs == 5 and s.top_k == 0


@pytest.mark.parametrize("extra, param", [({"min_tokens": 9}, "min_tokens"), ({"logit_bias": {"999999": 1}},
                                                                               "logit_bias")])
def test_sampling_extensions_checked_against_the_model(model, extra, param):
    with pytest.raises(ApiError) as err:
        admit_completion(CompletionBody(model="demo-tiny", prompt="x", max_tokens=4, **extra), model, ENV)
    assert err.value.param == param and err.value.status == 400


@pytest.mark.parametrize("max_tokens", [0, -3])
def test_max_tokens_below_one_is_refused(model, max_tokens):
    with pytest.raises(ApiError) as err:
        admit_completion(CompletionBody(model="demo-tiny", prompt="x", max_tokens=max_tokens), model, ENV)
    assert err.value.code == ErrorCode.INVALID_REQUEST and err.value.param == "max_tokens"
    assert err.value.status == 400


def test_max_tokens_beyond_the_context_names_the_limit(model):
    with pytest.raises(ApiError) as err:
        admit_completion(CompletionBody(model="demo-tiny", prompt=[1, 2, 3, 4], max_tokens=61), model, ENV)
    assert err.value.code == ErrorCode.CONTEXT_LENGTH_EXCEEDED
    assert "at most 60" in err.value.message and err.value.status == 400


def test_a_prompt_longer_than_the_context_is_refused(model):
    with pytest.raises(ApiError) as err:
        admit_completion(CompletionBody(model="demo-tiny", prompt=list(range(1, 80)), max_tokens=1), model, ENV)
    assert err.value.code == ErrorCode.CONTEXT_LENGTH_EXCEEDED


def test_out_of_vocabulary_ids_and_empty_prompts_are_refused(model):
    with pytest.raises(ApiError):
        admit_completion(CompletionBody(model="demo-tiny", prompt=[10**9], max_tokens=1), model, ENV)
    with pytest.raises(ApiError):
        admit_completion(CompletionBody(model="demo-tiny", prompt="", max_tokens=1), model, ENV)
    with pytest.raises(ApiError) as err:
        admit_completion(CompletionBody(model="demo-tiny", prompt=["a"] * 65, max_tokens=1), model, ENV)
    assert "at most 64 prompts" in err.value.message


@pytest.mark.parametrize("body", [
    {"model": "m", "messages": []},  # empty message list
    {"model": "m", "messages": [{"role": "wizard", "content": "x"}]},
    {"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 17},
    {"model": "m", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},  # without logprobs
    {"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 5},
    {"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": ["a", "b", "c", "d", "e"]},
    {"model": "m", "messages": [{"role": "user", "content": "x", "unknown_knob": 1}]},  # inside a message: strict
    {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": "ten"},
    {"messages": [{"role": "user", "content": "x"}]},  # missing model
])
def test_malformed_chat_bodies_fail_validation(body):
    with pytest.raises(ValidationError):
        ChatBody.model_validate(body)
