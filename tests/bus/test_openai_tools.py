"""Tool calling through the official `openai` SDK against a real gateway + dispatcher + worker (demo-tiny, random
weights, its Qwen2.5-style template) over a real nats-server: a required or named tool_choice comes back as a parsed
call whose arguments validate against the function's parameters, streamed and not; earlier calls and tool results
go through the chat template (issue 26, docs/api.md)."""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.json_schemas import ORDER

from .cluster import sdk_fixtures

MODEL = "demo-tiny"
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather now",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "place_order", "parameters": ORDER}}]
PARAMETERS = {"get_weather": WEATHER, "place_order": ORDER}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


cluster, client = sdk_fixtures(MODEL, tag="tools", ttft_slo_ms=60000, timeout_s=180)


def _check(calls, names) -> None:
    assert calls and all(c.type == "function" and c.id for c in calls)
    for call in calls:
        assert call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), PARAMETERS[call.function.name])


@pytest.mark.parametrize("name", sorted(PARAMETERS))
async def test_a_named_tool_choice_returns_a_valid_call(client, name):
    answer = await client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, max_tokens=400, temperature=1.0, seed=5, n=2,
        tool_choice={"type": "function", "function": {"name": name}})
    for choice in answer.choices:
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        _check(choice.message.tool_calls, {name})


async def test_required_returns_calls_of_the_given_tools(client):
    for seed in (1, 2, 3):
        answer = await client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=400,
                                                      temperature=1.0, seed=seed, tool_choice="required",
                                                      parallel_tool_calls=False)
        choice = answer.choices[0]
        assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
        _check(choice.message.tool_calls, set(PARAMETERS))


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
async def test_streamed_calls_come_as_tool_call_deltas(client, tool_choice):
    stream = await client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=400,
                                                  temperature=1.0, seed=4, stream=True, tool_choice=tool_choice,
                                                  parallel_tool_calls=False)
    calls: dict[int, dict] = {}
    finish, content = None, ""
    async for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or ():
                call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                call["id"] += delta.id or ""
                call["name"] += (delta.function.name or "") if delta.function else ""
                call["arguments"] += (delta.function.arguments or "") if delta.function else ""
    assert finish == "tool_calls" and content == "" and len(calls) == 1
    call = calls[0]
    assert call["id"] and call["name"] in PARAMETERS
    jsonschema.validate(json.loads(call["arguments"]), PARAMETERS[call["name"]])


async def test_history_with_calls_and_results_renders_and_auto_answers(client):
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21}'}]
    with_tools = await client.post("/../tokenize", cast_to=object, body={"model": MODEL, "messages": ASK})
    answer = await client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, max_tokens=8,
                                                  temperature=0, extra_body={"ignore_eos": True})
    # auto: a random-weight model writes no <tool_call>, so the text comes back as content
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls
    assert answer.usage.prompt_tokens > with_tools["count"] + 100  # the tools block, the call and the result
    none = await client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, tool_choice="none",
                                                max_tokens=1)
    assert none.usage.prompt_tokens < answer.usage.prompt_tokens  # no tools rendered


async def test_bad_tool_choices_are_a_400(client):
    for kw, param in [({"tool_choice": "required"}, "tool_choice"),
                      ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
                       "tool_choice"),
                      ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
                       "response_format")]:
        with pytest.raises(openai.BadRequestError) as err:
            await client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4, **kw)
        assert err.value.body["param"] == param
