"""Grammar-constrained decoding in the engine (worker/engine/grammar.py): a random-weight model's output always
parses and validates against the request's JSON schema, batched with unconstrained rows and n > 1."""
from __future__ import annotations

import json

import jsonschema
import pytest

from contracts import GuidedDecoding, SamplingParams
from tests.json_schemas import PERSON
from worker.engine.engine import LLMEngine
from worker.engine.grammar import bounded_strings_as_patterns

@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return LLMEngine(tiny_model_dir)


def _guided(schema: dict) -> GuidedDecoding:
    return GuidedDecoding(kind="json_schema", json_schema=json.dumps(schema, sort_keys=True))


def _run(engine: LLMEngine) -> dict[tuple[str, int], dict]:
    """Each (request, choice): its token ids, text and finish reason."""
    out: dict[tuple[str, int], dict] = {}
    while engine.has_unfinished():
        for o in engine.step():
            entry = out.setdefault((o.request_id, o.index), {"ids": [], "text": "", "finish": None})
            entry["ids"] += o.token_ids
            entry["text"] += o.text
            entry["finish"] = o.choice_finish_reason or o.finish_reason or entry["finish"]
    return out


def test_every_sample_of_a_batch_validates_while_a_plain_row_runs_beside_it(engine):
    prompt = engine.tokenizer.encode("A person as JSON:")
    guided = _guided(PERSON)
    for seed in range(4):
        engine.add_request(f"p{seed}", prompt, SamplingParams(max_tokens=300, temperature=1.0, seed=seed,
                                                               guided=guided))
    engine.add_request("greedy-n", prompt, SamplingParams(max_tokens=300, temperature=0.0, n=2, guided=guided))
    engine.add_request("plain", prompt, SamplingParams(max_tokens=20, temperature=1.0, seed=0, ignore_eos=True))
    out = _run(engine)
    constrained = {k: v for k, v in out.items() if k[0] != "plain"}
    assert len(constrained) == 6
    for key, entry in constrained.items():
        assert entry["finish"] == "stop", (key, entry)
        jsonschema.validate(json.loads(entry["text"]), PERSON)
    assert len(out[("plain", 0)]["ids"]) == 20  # the unconstrained row is not masked (it would have stopped)


def test_the_mask_changes_what_an_unconstrained_greedy_run_would_say(engine):
    prompt = engine.tokenizer.encode("Hello")
    engine.add_request("free", prompt, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    engine.add_request("json", prompt, SamplingParams(max_tokens=8, temperature=0.0,
                                                      guided=GuidedDecoding(kind="json_object")))
    out = _run(engine)
    assert out[("json", 0)]["text"].startswith("{")
    assert out[("free", 0)]["text"] != out[("json", 0)]["text"]


def test_min_tokens_cannot_hold_back_a_completed_grammar(engine):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    engine.add_request("m", engine.tokenizer.encode("Hi"), SamplingParams(max_tokens=40, temperature=1.0, seed=1,
                                                                           min_tokens=40, guided=_guided(schema)))
    entry = _run(engine)[("m", 0)]
    assert json.loads(entry["text"])["ok"] in (True, False)


def test_a_schema_the_grammar_compiler_refuses_fails_at_add(engine):
    bad = GuidedDecoding(kind="json_schema", json_schema='{"type": "object", "properties": 7}')
    with pytest.raises(ValueError, match="response_format"):
        engine.add_request("bad", [1, 2, 3], SamplingParams(max_tokens=4, guided=bad))


def test_one_compilation_per_schema(engine):
    book = engine.sampler.grammars
    schema = {"type": "object", "properties": {"x": {"enum": [1, 2]}}, "required": ["x"]}
    before = book.num_compiled
    for i in range(3):
        engine.add_request(f"c{i}", [1, 2, 3], SamplingParams(max_tokens=30, temperature=1.0, guided=_guided(schema)))
    _run(engine)
    assert book.num_compiled == before + 1


def test_bounded_strings_become_patterns_without_control_characters():
    text = bounded_strings_as_patterns(json.dumps({"type": "object", "properties": {
        "a": {"type": "string", "maxLength": 3}, "b": {"type": "string", "pattern": "^x$", "maxLength": 9}}}))
    props = json.loads(text)["properties"]
    assert props["a"] == {"type": "string", "pattern": '^[^\\x00-\\x1f"\\\\]{0,3}$'}
    assert props["b"] == {"type": "string", "pattern": "^x$", "maxLength": 9}
    pattern = jsonschema.Draft202012Validator({"type": "string", **props["a"]})
    assert pattern.is_valid("abc") and not pattern.is_valid("a\x17") and not pattern.is_valid("abcd")
