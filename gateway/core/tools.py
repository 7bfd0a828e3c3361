"""Tool calling (docs/api.md): tools and earlier calls into the chat template, the model's calls out of its text.

`tool_choice`: `none` renders no tools and parses nothing; `auto` renders them and parses whatever calls the model
wrote, in its family's format (Hermes `<tool_call>{"name", "arguments"}</tool_call>` as Qwen2.5 writes; a bare
Llama 3 `{"name", "parameters"}` object); `required` and a named function constrain the output with a grammar
(structured.py's JSON schemas): a named function's output is its arguments object, `required`'s an array of
`{"name", "arguments"}` calls (one when `parallel_tool_calls` is false), as vLLM does. So a call comes back even
from a model that would never write one.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from contracts import ErrorCode, GuidedDecoding

from .api import ChatBody, NamedToolChoice
from .errors import ApiError
from .structured import check_schema, guided_of

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_ANY_OBJECT = {"type": "object"}


@dataclass(frozen=True)
class ToolPlan:
    """How a chat request's tools are served: `mode` none | auto | required | named."""

    mode: str
    tools: tuple[dict, ...] = ()  # what the template renders
    name: str = ""  # named: the function
    call_format: str = "hermes"  # auto: how the model writes calls


def plan_tools(body: ChatBody, call_format: str) -> ToolPlan:
    tools = tuple(t.model_dump(exclude_none=True) for t in body.tools or ())
    choice = body.tool_choice or ("auto" if tools else "none")
    if choice != "none" and not tools:
        raise ApiError(ErrorCode.INVALID_REQUEST, "tool_choice needs tools", "tool_choice")
    if choice == "none":
        return ToolPlan("none")
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in {t["function"]["name"] for t in tools}:
            raise ApiError(ErrorCode.INVALID_REQUEST, f"no tool is named {choice.function.name!r}", "tool_choice")
        return ToolPlan("named", tools, name=choice.function.name)
    return ToolPlan(choice, tools, call_format=call_format)


def _parameters(tool: dict) -> dict:
    return tool["function"].get("parameters") or _ANY_OBJECT


def guided_for(body: ChatBody, plan: ToolPlan) -> GuidedDecoding | None:
    """The grammar the output follows: a forced call's, else the response_format's."""
    if plan.mode not in ("required", "named"):
        return guided_of(body.response_format)
    if body.response_format is not None and body.response_format.type != "text":
        raise ApiError(ErrorCode.INVALID_REQUEST, "response_format cannot be combined with a required or named "
                       "tool_choice (the call's arguments are the output)", "response_format")
    if plan.mode == "named":
        tool = next(t for t in plan.tools if t["function"]["name"] == plan.name)
        schema = _parameters(tool)
    else:
        calls = [{"type": "object", "properties": {"name": {"const": t["function"]["name"]},
                                                   "arguments": _parameters(t)},
                  "required": ["name", "arguments"], "additionalProperties": False} for t in plan.tools]
        schema = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
        if not body.parallel_tool_calls:
            schema["maxItems"] = 1
    return GuidedDecoding(kind="json_schema", json_schema=check_schema(schema, "tools"))


def template_messages(body: ChatBody) -> list[dict]:
    """The messages as chat templates expect them: text content, and earlier calls' arguments as objects
    (transformers' convention, which templates such as Qwen2.5's render with `tojson`)."""
    out = []
    for m in body.messages:
        msg: dict[str, Any] = {"role": m.role, "content": m.text()}
        if m.tool_calls:
            msg["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.function.name, "arguments": _arguments_object(c.function.arguments)}} for c in m.tool_calls]
        if m.tool_call_id is not None:
            msg["tool_call_id"] = m.tool_call_id
        out.append(msg)
    return out


def _arguments_object(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise ApiError(ErrorCode.INVALID_REQUEST, f"tool call arguments are not JSON: {text[:80]!r}",
                       "messages") from None


def new_call(name: str, arguments: Any) -> dict:
    """An OpenAI tool call; `arguments` as JSON text."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {"name": name, "arguments": text}}


def _call_of(obj: Any, args_key: str) -> dict | None:
    if isinstance(obj, dict) and isinstance(obj.get("name"), str) and isinstance(obj.get(args_key, {}), dict):
        return new_call(obj["name"], obj.get(args_key, {}))
    return None


def parse_calls(text: str, plan: ToolPlan) -> tuple[str | None, list[dict]]:
    """(the message content, the tool calls) of a finished output. Text that does not parse as a call stays
    content."""
    if plan.mode == "named":
        return None, [new_call(plan.name, text)]
    if plan.mode == "required":
        try:
            calls = [_call_of(c, "arguments") for c in json.loads(text)]
        except (json.JSONDecodeError, TypeError):
            return text, []
        return None, [c for c in calls if c is not None]
    if plan.mode != "auto":
        return text, []
    if plan.call_format == "llama3_json":
        try:
            call = _call_of(json.loads(text.strip().removeprefix("<|python_tag|>")), "parameters")
        except json.JSONDecodeError:
            return text, []
        return (None, [call]) if call else (text, [])
    start = text.find(HERMES_OPEN)
    if start < 0:
        return text, []
    calls = []
    for body in _HERMES.findall(text[start:]):
        try:
            call = _call_of(json.loads(body), "arguments")
        except json.JSONDecodeError:
            return text, []  # a broken call: the text as it is, as vLLM's Hermes parser does
        if call is None:
            return text, []
        calls.append(call)
    content = text[:start].rstrip()
    return (content or None), calls


def held_back(text: str, plan: ToolPlan) -> int:
    """Streaming in `auto`: where the content that may go out now ends (a Hermes call, or the start of one, is
    held until the output ends); everything is held in the other modes that parse."""
    if plan.mode == "none":
        return len(text)
    if plan.mode != "auto" or plan.call_format != "hermes":
        return 0
    start = text.find(HERMES_OPEN)
    if start >= 0:
        return start
    for k in range(min(len(HERMES_OPEN) - 1, len(text)), 0, -1):
        if text.endswith(HERMES_OPEN[:k]):
            return len(text) - k
    return len(text)
