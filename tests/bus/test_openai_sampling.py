"""The official `openai` SDK against a real gateway + dispatcher + worker (the torch engine on demo-tiny) over a real
nats-server: the sampling surface vLLM users expect (issue 26), streamed and not."""
from __future__ import annotations

import openai
import pytest

from runtime.tokenizer import TextTokenizer

from .cluster import sdk_fixtures

MODEL = "demo-tiny"
PROMPT = "The quick brown fox jumps over"


cluster, client = sdk_fixtures(MODEL, tag="sdk", ttft_slo_ms=30000, timeout_s=120)


@pytest.fixture(scope="module")
def pieces(demo_models_dir) -> set[tuple[str, bytes]]:
    """Every token's (text, bytes) as the tokenizer names it: what a logprob entry may say."""
    tok = TextTokenizer.from_dir(demo_models_dir / MODEL)
    return {tok.token_piece(i) for i in range(tok.vocab_size)}


def _engine(cluster):
    worker = next(s for name, s in cluster.services.items() if "worker" in name)
    return next(iter(worker.residents.values())).engine


async def _greedy(client, **extra):
    return await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0,
                                           logprobs=0, extra_body={"ignore_eos": True, **extra})


async def test_logit_bias_bans_and_min_tokens_masks_stop_ids(client):
    plain = await _greedy(client)
    first = plain.choices[0].logprobs.tokens[0]
    tok_id = (await client.post("/../tokenize", cast_to=object, body={"model": MODEL, "prompt": first}))["tokens"]
    banned = await _greedy(client, logit_bias={str(tok_id[0]): -100})
    assert banned.choices[0].logprobs.tokens[0] != first
    stopped = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0,
                                              extra_body={"stop_token_ids": tok_id})
    assert stopped.usage.completion_tokens == 1 and stopped.choices[0].finish_reason == "stop"
    held = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0,
                                           extra_body={"stop_token_ids": tok_id, "min_tokens": 3})
    assert held.usage.completion_tokens >= 3


async def test_penalties_change_a_repetitive_greedy_output(client):
    long = {"max_tokens": 24, "temperature": 0, "extra_body": {"ignore_eos": True}}
    plain = await client.completions.create(model=MODEL, prompt=PROMPT, **long)
    penalised = await client.completions.create(model=MODEL, prompt=PROMPT, frequency_penalty=2.0,
                                                presence_penalty=2.0, **long)
    stream = await client.completions.create(model=MODEL, prompt=PROMPT, frequency_penalty=2.0, presence_penalty=2.0,
                                             stream=True, **long)
    streamed = "".join([c.choices[0].text async for c in stream if c.choices])
    assert penalised.choices[0].text != plain.choices[0].text and streamed == penalised.choices[0].text
    repeated = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0,
                                               extra_body={"ignore_eos": True, "repetition_penalty": 5.0})
    assert repeated.choices[0].text != plain.choices[0].text


async def test_bad_values_are_a_400_naming_the_param(client):
    for kw, param in [({"presence_penalty": 3}, "presence_penalty"), ({"logprobs": 21}, "logprobs"),
                      ({"extra_body": {"min_p": 2}}, "min_p"), ({"n": 2, "best_of": 3}, "best_of")]:
        with pytest.raises(openai.BadRequestError) as err:
            await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, **kw)
        assert err.value.body["param"] == param


@pytest.mark.parametrize("stream", [False, True])
async def test_chat_top_logprobs_name_every_alternative(client, pieces, stream):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=6, temperature=0,
              logprobs=True, top_logprobs=20, extra_body={"ignore_eos": True})
    if stream:
        entries, text = [], ""
        async for chunk in await client.chat.completions.create(stream=True, **kw):
            if chunk.choices and chunk.choices[0].logprobs:
                entries += chunk.choices[0].logprobs.content
            text += chunk.choices[0].delta.content or "" if chunk.choices else ""
    else:
        done = await client.chat.completions.create(**kw)
        entries, text = done.choices[0].logprobs.content, done.choices[0].message.content
    assert len(entries) == 6
    for entry in entries:
        assert len(entry.top_logprobs) == 20
        alts = [(a.token, bytes(a.bytes)) for a in entry.top_logprobs]
        assert set(alts) <= pieces and len(set(alts)) == 20  # each names a real token, each a different one
        lps = [a.logprob for a in entry.top_logprobs]
        assert lps == sorted(lps, reverse=True)
        assert (entry.token, entry.logprob) == (entry.top_logprobs[0].token, lps[0])  # greedy: the top one
    assert b"".join(bytes(e.bytes) for e in entries).decode("utf-8", errors="replace") == text


@pytest.mark.parametrize("stream", [False, True])
async def test_completions_logprobs_give_alternatives_and_offsets(client, pieces, stream):
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=3, extra_body={"ignore_eos": True})
    if stream:
        tokens, tops, text = [], [], ""
        async for chunk in await client.completions.create(stream=True, **kw):
            if chunk.choices and chunk.choices[0].logprobs:
                tokens += chunk.choices[0].logprobs.tokens
                tops += chunk.choices[0].logprobs.top_logprobs
            text += chunk.choices[0].text if chunk.choices else ""
    else:
        done = await client.completions.create(**kw)
        lp = done.choices[0].logprobs
        tokens, tops, text = lp.tokens, lp.top_logprobs, done.choices[0].text
        assert lp.text_offset == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    assert len(tokens) == 5
    if not any(t.startswith("bytes:") for t in tokens):  # a piece inside a character is named by its bytes
        assert "".join(tokens) == text
    for token, top in zip(tokens, tops):
        assert token in top and 1 <= len(top) <= 4 and all(t in {p[0] for p in pieces} for t in top)


async def test_n_choices_come_from_one_prompt_computation(client, cluster):
    engine = _engine(cluster)
    before = engine.num_prefill_tokens_computed
    hits_before = engine.stats().prefix_cache_hits  # an earlier test's prompt may be cached (prefix caching)
    done = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, n=4, seed=7,
                                           extra_body={"ignore_eos": True})
    computed = engine.num_prefill_tokens_computed - before
    found_cached = engine.stats().prefix_cache_hits - hits_before
    assert [c.index for c in done.choices] == [0, 1, 2, 3]
    assert computed + found_cached == done.usage.prompt_tokens  # once, not four times
    assert done.usage.completion_tokens == 20 and len({c.text for c in done.choices}) > 1
    again = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, n=4, seed=7,
                                            extra_body={"ignore_eos": True})
    assert [c.text for c in again.choices] == [c.text for c in done.choices]


async def test_streamed_n_chat_chunks_carry_their_choice_index(client):
    stream = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, n=3, seed=1, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    texts: dict[int, str] = {}
    finishes: dict[int, list] = {}
    usage = None
    async for chunk in stream:
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason:
                finishes.setdefault(c.index, []).append(c.finish_reason)
        usage = chunk.usage or usage
    assert sorted(texts) == [0, 1, 2] and finishes == {0: ["length"], 1: ["length"], 2: ["length"]}
    assert usage.completion_tokens == 12


@pytest.mark.parametrize("stream", [False, True])
async def test_echo_and_batched_prompts_one_choice_per_prompt_in_order(client, stream):
    prompts = ["Hello there", "The quick brown", "Once upon"]
    kw = dict(model=MODEL, max_tokens=3, temperature=0, echo=True, extra_body={"ignore_eos": True})
    alone = [(await client.completions.create(prompt=p, **kw)).choices[0].text for p in prompts]
    assert all(text.startswith(p) and len(text) > len(p) for text, p in zip(alone, prompts))
    if stream:
        texts: dict[int, str] = {}
        async for chunk in await client.completions.create(prompt=prompts, stream=True, **kw):
            for c in chunk.choices:
                texts[c.index] = texts.get(c.index, "") + c.text
        got = [texts[i] for i in range(3)]
    else:
        done = await client.completions.create(prompt=prompts, **kw)
        assert [c.index for c in done.choices] == [0, 1, 2] and done.usage.completion_tokens == 9
        got = [c.text for c in done.choices]
    assert got == alone
