"""Structured outputs through the official `openai` SDK against a real gateway + dispatcher + worker (the torch
engine on demo-tiny, random weights) over a real nats-server: every `json_schema` answer parses and validates,
streamed and not (issue 26, docs/api.md)."""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.json_schemas import ORDER, PERSON
from runtime.tokenizer import TextTokenizer

from .cluster import sdk_fixtures

MODEL = "demo-tiny"
ASK = [{"role": "user", "content": "Describe a user as JSON."}]

SCHEMAS = {"person": PERSON, "order": ORDER}


cluster, client = sdk_fixtures(MODEL, tag="structured", ttft_slo_ms=60000, timeout_s=180)


def _format(name: str, strict: bool = True) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": strict}}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
async def test_json_schema_answers_validate(client, name):
    answer = await client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=400, temperature=1.0,
                                                  n=3, seed=7, response_format=_format(name))
    assert len(answer.choices) == 3
    for choice in answer.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), SCHEMAS[name])
    greedy = await client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=400, temperature=0,
                                                  response_format=_format(name, strict=False))
    jsonschema.validate(json.loads(greedy.choices[0].message.content), SCHEMAS[name])


@pytest.mark.parametrize("name", sorted(SCHEMAS))
async def test_streamed_json_schema_answers_validate(client, name):
    for seed in (1, 2):
        stream = await client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=400, temperature=1.0,
                                                      seed=seed, stream=True, response_format=_format(name))
        parts, finish = [], None
        async for chunk in stream:
            for choice in chunk.choices:
                parts.append(choice.delta.content or "")
                finish = choice.finish_reason or finish
        assert finish == "stop"
        jsonschema.validate(json.loads("".join(parts)), SCHEMAS[name])


async def test_completions_take_response_format_too(client):
    answer = await client.completions.create(model=MODEL, prompt="JSON:", max_tokens=400, temperature=1.0, seed=3,
                                             extra_body={"response_format": _format("order")})
    jsonschema.validate(json.loads(answer.choices[0].text), ORDER)


async def test_json_object_answers_parse(client, demo_models_dir):
    # Any JSON object: a random-weight model's strings rarely end, as nearly every token may continue one; a bias
    # toward the tokens that can close a string or an object lets it finish (the grammar still decides what is valid)
    tok = TextTokenizer.from_dir(demo_models_dir / MODEL)
    closing = {str(i): 6 for i in range(tok.vocab_size) if any(c in tok.token_piece(i)[0] for c in '"}')}
    for seed in (1, 2, 3):
        answer = await client.chat.completions.create(
            model=MODEL, messages=ASK, max_tokens=400, temperature=1.0, seed=seed,
            response_format={"type": "json_object"}, logit_bias=dict(list(closing.items())[:1024]))
        assert answer.choices[0].finish_reason == "stop"
        assert isinstance(json.loads(answer.choices[0].message.content), dict)


async def test_text_is_unconstrained(client):
    answer = await client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=5, temperature=0,
                                                  response_format={"type": "text"},
                                                  extra_body={"ignore_eos": True})
    assert answer.usage.completion_tokens == 5


@pytest.mark.parametrize("response_format, says", [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}, "invalid JSON schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": {
        "type": "object", "properties": {"a": {"type": "string"}}}}}, "additionalProperties"),
    ({"type": "json_schema"}, "json_schema"),
    ({"type": "yaml"}, "type"),
])
async def test_bad_formats_are_a_400_naming_response_format(client, response_format, says):
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=5,
                                             response_format=response_format)
    assert err.value.body["param"] == "response_format" and says in err.value.body["message"]
