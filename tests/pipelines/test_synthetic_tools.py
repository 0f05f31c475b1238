"""The synthetic pipeline's tool arguments: made from the client's JSON schema, which is unchecked.

Whatever a client puts in a tool's ``parameters`` (the fuzzer found ``"properties": "x"``), making
the arguments never raises, and for a real schema the arguments validate against it.
"""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from pipelines.synthetic import MAX_ITEMS, MAX_STRING, arguments_for

WORDS = "What is the weather in Paris today".split()

REAL = [
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}, "op": {"enum": ["add", "sub"]}}, "required": ["a", "b", "op"]},
    {"type": "object", "properties": {"guests": {"type": "integer", "minimum": 1, "maximum": 12}, "when": {"type": "string", "minLength": 5}}},
    {"type": "object", "properties": {"ids": {"type": "array", "items": {"type": "string"}, "minItems": 2}}, "required": ["ids"]},
    {"type": "object", "properties": {"x": {"anyOf": [{"type": "integer", "exclusiveMinimum": 3}, {"type": "null"}]}}, "required": ["x"]},
    {"type": "object", "properties": {"flag": {"type": ["null", "boolean"]}, "k": {"const": 7}}, "required": ["flag", "k"]},
]


@pytest.mark.parametrize("schema", REAL, ids=range(len(REAL)))
def test_arguments_satisfy_a_real_schema(schema):
    args = arguments_for(schema, WORDS)
    jsonschema.validate(args, schema)
    if "city" in schema["properties"]:
        assert args == {"city": "Paris"}


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": "x"},  # the fuzzer's find
        {"type": "object", "properties": ["city"], "required": ["city"]},
        {"type": "object", "properties": {"a": "not a schema"}, "required": "a"},
        {"type": "object", "required": [1, None, "a"]},
        {"enum": "abc"},
        {"anyOf": {"type": "string"}},
        {"type": "array", "minItems": 10**12},
        {"type": "array", "minItems": "3", "items": 5},
        {"type": "string", "minLength": 10**12},
        {"type": "integer", "minimum": "1"},
        {"type": "number", "minimum": float("inf")},
        {"type": "integer", "exclusiveMinimum": True},
        {"type": 42},
        [],
        "object",
        None,
    ],
)
def test_a_hostile_schema_gets_an_answer_not_an_exception(schema):
    args = arguments_for(schema, WORDS)
    assert len(json.dumps(args)) <= 2 * MAX_ITEMS * MAX_STRING


def _random_json(rng: random.Random, depth: int = 0):
    keys = ["type", "properties", "required", "items", "enum", "const", "anyOf", "oneOf", "allOf", "minItems", "minimum", "exclusiveMinimum", "minLength", "city"]
    leaf = [None, True, False, 0, -1, 10**20, 1.5, float("nan"), "", "object", "array", "string", "integer", "number", "null", "boolean"]
    if depth > 4 or rng.random() < 0.3:
        return rng.choice(leaf)
    if rng.random() < 0.3:
        return [_random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(keys): _random_json(rng, depth + 1) for _ in range(rng.randrange(5))}


def test_generated_schemas_never_raise():
    """10,000 seeded random schemas (random shapes over the keywords the maker reads): each gives
    a value that serialises to JSON. A failure names its seed and schema."""
    for seed in range(10_000):
        schema = _random_json(random.Random(seed))
        try:
            json.dumps(arguments_for(schema, WORDS), allow_nan=True)
        except Exception as exc:  # pragma: no cover - the report of a failure
            pytest.fail(f"seed {seed}: {schema!r} -> {exc!r}")


def test_a_deeply_nested_schema_is_bounded():
    schema: dict = {"type": "string"}
    for _ in range(10_000):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    args = arguments_for(schema, WORDS)
    depth = 0
    while isinstance(args, dict) and args:
        args, depth = args["a"], depth + 1
    assert depth <= 40
