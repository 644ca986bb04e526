"""Hand-written JSON Schemas, regexes and choice lists the constrained-decoding tests run."""

from __future__ import annotations

from typing import Any

_ADDRESS = {
    "type": "object",
    "properties": {"street": {"type": "string", "maxLength": 20}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
    "required": ["street", "zip"],
}
_TOOL = {
    "oneOf": [
        {
            "type": "object",
            "properties": {"tool": {"const": "search"}, "query": {"type": "string", "maxLength": 30}},
            "required": ["tool", "query"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {
                "tool": {"const": "calculator"},
                "expression": {"type": "string", "pattern": "^[0-9+*/() -]{1,20}$"},
            },
            "required": ["tool", "expression"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {
                "tool": {"const": "weather"},
                "city": {"type": "string", "maxLength": 15},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["tool", "city"],
            "additionalProperties": False,
        },
    ]
}

SCHEMAS: dict[str, Any] = {
    "flat": {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 30}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    },
    "optional_fields": {
        "type": "object",
        "properties": {
            "a": {"type": "integer"},
            "b": {"type": "boolean"},
            "c": {"type": "null"},
            "d": {"type": "string", "maxLength": 5},
        },
    },
    "one_required_among_optional": {
        "type": "object",
        "properties": {"x": {"type": "number"}, "y": {"type": "number"}, "z": {"type": "number"}},
        "required": ["y"],
    },
    "nested": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {"id": {"type": "integer", "minimum": 1}, "address": _ADDRESS},
                "required": ["id", "address"],
            }
        },
        "required": ["user"],
    },
    "array_of_objects": {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "maxItems": 4,
                "items": {
                    "type": "object",
                    "properties": {
                        "sku": {"type": "string", "maxLength": 8},
                        "qty": {"type": "integer", "minimum": 1, "maximum": 99},
                    },
                    "required": ["sku", "qty"],
                },
            }
        },
        "required": ["items"],
    },
    "enum": {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "size": {"type": "string", "enum": ["S", "M", "L", "XL"]},
        },
        "required": ["color", "size"],
    },
    "mixed_enum": {"enum": [1, "two", None, True, {"k": [3]}]},
    "const": {
        "type": "object",
        "properties": {"version": {"const": "1.0"}, "kind": {"const": 7}},
        "required": ["version", "kind"],
    },
    "pattern": {
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2,4}$"},
            "tag": {"type": "string", "pattern": "^#[a-z_]{1,11}$"},
        },
        "required": ["code"],
    },
    "anchored_pattern": {"type": "string", "pattern": "^(ab+c|x[0-9]{2})$"},
    "formats": {
        "type": "object",
        "properties": {
            f: {"type": "string", "format": f} for f in ("date-time", "date", "time", "email", "uuid", "ipv4", "uri")
        },
        "required": ["date-time", "email", "uuid"],
    },
    "numbers": {
        "type": "object",
        "properties": {
            "n": {"type": "number"},
            "i": {"type": "integer"},
            "neg": {"type": "integer", "maximum": -5},
            "pct": {"type": "number", "minimum": 0, "maximum": 100},
            "small": {"type": "integer", "minimum": -3, "maximum": 3},
        },
        "required": ["n", "i", "neg", "pct", "small"],
    },
    "exclusive_bounds": {
        "type": "object",
        "properties": {
            "p": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
            "k": {"type": "integer", "exclusiveMinimum": 10, "exclusiveMaximum": 20},
        },
        "required": ["p", "k"],
    },
    "top_number": {"type": "number"},
    "top_integer_range": {"type": "integer", "minimum": 100, "maximum": 2500},
    "top_string": {"type": "string", "minLength": 2, "maxLength": 8},
    "top_boolean": {"type": "boolean"},
    "string_lengths": {
        "type": "object",
        "properties": {"s": {"type": "string", "minLength": 3, "maxLength": 6}},
        "required": ["s"],
    },
    "array_bounds": {
        "type": "array",
        "items": {"type": "integer", "minimum": 0, "maximum": 9},
        "minItems": 2,
        "maxItems": 5,
    },
    "tuple": {
        "type": "array",
        "prefixItems": [{"type": "string", "maxLength": 4}, {"type": "integer"}, {"type": "boolean"}],
        "items": False,
        "minItems": 3,
    },
    "ref_definitions": {
        "type": "object",
        "definitions": {
            "point": {
                "type": "object",
                "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                "required": ["x", "y"],
            }
        },
        "properties": {"from": {"$ref": "#/definitions/point"}, "to": {"$ref": "#/definitions/point"}},
        "required": ["from", "to"],
    },
    "ref_defs_recursive": {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "value": {"type": "integer", "minimum": 0, "maximum": 9},
                    "children": {"type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/node"}},
                },
                "required": ["value"],
            }
        },
        "$ref": "#/$defs/node",
    },
    "anyof": {
        "type": "object",
        "properties": {"id": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 6}]}},
        "required": ["id"],
    },
    "tool_call_oneof": _TOOL,
    "tool_calls_array": {"type": "array", "items": _TOOL, "minItems": 1, "maxItems": 3},
    "allof": {
        "allOf": [
            {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            {"properties": {"b": {"type": "string", "maxLength": 4}}, "required": ["b"]},
        ]
    },
    "type_list": {
        "type": "object",
        "properties": {"v": {"type": ["string", "null"], "maxLength": 5}},
        "required": ["v"],
    },
    "free_dict": {"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 3},
    "no_extra_props": {
        "type": "object",
        "properties": {"k": {"type": "string", "maxLength": 5}},
        "additionalProperties": False,
        "required": ["k"],
    },
    "any_value": {"type": "object", "properties": {"payload": {}}, "required": ["payload"]},
    "openai_strict": {
        "type": "object",
        "properties": {
            "answer": {"type": "string", "maxLength": 40},
            "confidence": {"type": "number", "minimum": 0, "maximum": 1},
            "sources": {"type": "array", "items": {"type": "string", "format": "uri"}, "maxItems": 2},
        },
        "required": ["answer", "confidence", "sources"],
        "additionalProperties": False,
    },
    "nullable_and_bool_schema": {
        "type": "object",
        "properties": {"maybe": {"type": ["integer", "null"]}, "never": False},
        "required": ["maybe"],
    },
    "unicode_enum": {"enum": ["café", "naïve", "日本"]},
}

REGEXES = [
    r"[0-9]{1,4}(\.[0-9]{1,3})?",
    r"(yes|no)(, (yes|no)){0,4}",
    r"[a-z]{3,8}@[a-z]{2,6}\.(com|org)",
    r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}",
    r"(ha){1,5}!",
]

CHOICES = [["yes", "no"], ["red", "green", "blue", "green-blue"], ["Paris", "London", "東京"]]
