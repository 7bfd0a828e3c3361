"""Structured outputs at admission (docs/api.md): from `response_format` to the engine's `GuidedDecoding`.

The schema is checked here against its JSON Schema meta-schema (and, with `strict`, OpenAI's strict rules), so a
bad schema is a 400 naming `response_format` before any worker sees it. The engine compiles the grammar against
the model's tokenizer (worker/engine/grammar.py); a schema valid here that the grammar compiler cannot take fails
there, also as a 400.
"""
from __future__ import annotations

import json
from typing import Any

from jsonschema import SchemaError
from jsonschema.validators import validator_for

from contracts import ErrorCode, GuidedDecoding
from contracts.requests import MAX_JSON_SCHEMA_CHARS

from .api import ResponseFormat
from .errors import ApiError

PARAM = "response_format"


def canonical(schema: dict[str, Any]) -> str:
    """One text per schema (sorted keys, no spaces): the engine's grammar cache key."""
    return json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def check_schema(schema: Any, param: str = PARAM) -> str:
    """The schema's canonical text, or a 400 naming `param` when it is not a valid JSON schema."""
    if not isinstance(schema, dict):
        raise ApiError(ErrorCode.INVALID_REQUEST, "the JSON schema must be an object", param)
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "the root"
        raise ApiError(ErrorCode.INVALID_REQUEST, f"invalid JSON schema at {where}: {exc.message}", param) from None
    text = canonical(schema)
    if len(text) > MAX_JSON_SCHEMA_CHARS:
        raise ApiError(ErrorCode.INVALID_REQUEST, f"the JSON schema is longer than {MAX_JSON_SCHEMA_CHARS} "
                       "characters", param)
    return text


def strict_violation(schema: Any, path: str = "#") -> str | None:
    """OpenAI's strict mode: every object lists all its properties as required and sets additionalProperties
    false. The first place that does not, or None."""
    if isinstance(schema, list):
        return next((v for i, s in enumerate(schema) if (v := strict_violation(s, f"{path}/{i}"))), None)
    if not isinstance(schema, dict):
        return None
    if schema.get("type") == "object" or "properties" in schema:
        if schema.get("additionalProperties") is not False:
            return f"{path}: additionalProperties must be false"
        missing = sorted(set(schema.get("properties", {})) - set(schema.get("required", [])))
        if missing:
            return f"{path}: every property must be required (missing {', '.join(missing)})"
    return next((v for k, s in schema.items() if isinstance(s, (dict, list))
                 and (v := strict_violation(s, f"{path}/{k}"))), None)


def guided_of(response_format: ResponseFormat | None) -> GuidedDecoding | None:
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return GuidedDecoding(kind="json_object")
    spec = response_format.json_schema
    assert spec is not None and spec.schema_ is not None  # the body's validator says so
    text = check_schema(spec.schema_)
    if spec.strict and (why := strict_violation(spec.schema_)):
        raise ApiError(ErrorCode.INVALID_REQUEST, f"strict json_schema: {why}", PARAM)
    return GuidedDecoding(kind="json_schema", json_schema=text)
