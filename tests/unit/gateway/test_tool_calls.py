"""Tool calls out of a model's text (gateway/core/tools.py): Hermes and Llama 3 JSON formats, forced calls, and
what streaming may send as content before the output ends."""
from __future__ import annotations

import json

from gateway.core.tools import ToolPlan, held_back, parse_calls

AUTO = ToolPlan("auto", ({"type": "function", "function": {"name": "f"}},))


def test_hermes_calls_after_content_are_parsed():
    text = 'Let me look.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>\n' \
           '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>'
    content, calls = parse_calls(text, AUTO)
    assert content == "Let me look."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [("f", {"x": 1}),
                                                                                              ("g", {})]
    assert len({c["id"] for c in calls}) == 2


def test_a_broken_call_stays_text():
    text = '<tool_call>\n{"name": "f", "arguments": {"x": </tool_call>'
    assert parse_calls(text, AUTO) == (text, [])
    assert parse_calls("no call here", AUTO) == ("no call here", [])


def test_llama3_json_and_forced_calls():
    content, calls = parse_calls('{"name": "f", "parameters": {"q": "a"}}', ToolPlan("auto", call_format="llama3_json"))
    assert content is None and calls[0]["function"]["arguments"] == '{"q": "a"}'
    _, named = parse_calls('{"a": 2}', ToolPlan("named", name="f"))
    assert named[0]["function"] == {"name": "f", "arguments": '{"a": 2}'}
    _, required = parse_calls('[{"name": "f", "arguments": {}}]', ToolPlan("required"))
    assert required[0]["function"]["name"] == "f"


def test_streaming_holds_what_may_start_a_call():
    assert held_back("Hello <tool", AUTO) == len("Hello ")
    assert held_back('Hi <tool_call>{"name"', AUTO) == len("Hi ")
    assert held_back("Hello <b>", AUTO) == len("Hello <b>")
    assert held_back("[{", ToolPlan("required")) == 0
