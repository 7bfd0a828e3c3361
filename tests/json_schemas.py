"""JSON schemas the structured-output tests constrain a random-weight model to: nested objects, enums, arrays,
patterns, bounded strings and numbers (bounded, so that a model whose strings rarely end still finishes)."""
from __future__ import annotations

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
        "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                                      "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["city", "zip"], "additionalProperties": False},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "role", "tags", "address", "active"],
    "additionalProperties": False,
}
ORDER = {
    "type": "object",
    "properties": {
        "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
            "type": "object", "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
                                             "qty": {"type": "integer", "minimum": 1, "maximum": 9}},
            "required": ["sku", "qty"], "additionalProperties": False}},
        "express": {"type": "boolean"},
        "note": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 5}]},
    },
    "required": ["items", "express", "note"],
    "additionalProperties": False,
}
