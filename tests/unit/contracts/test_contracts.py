from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from contracts import GenerateRequest, SamplingParams, subjects
from contracts.catalog import ROUTES, json_schema
from contracts.stream import STREAM_EVENT, TokenChunk


def _request(**kw) -> GenerateRequest:
    base = dict(request_id="r", model="m", prompt_token_ids=(1, 2), sampling=SamplingParams(max_tokens=3),
                arrival_unix_ms=1.0, ttft_deadline_unix_ms=2.0, tpot_slo_ms=10.0, reply_subject="x")
    base.update(kw)
    return GenerateRequest(**base)


def test_messages_are_frozen_strict_and_versioned():
    req = _request()
    assert req.schema_version == 1
    with pytest.raises(ValidationError):
        req.model_copy(update={}).__class__(**{**req.model_dump(), "surprise": 1})
    with pytest.raises(ValidationError):
        req.request_id = "other"  # type: ignore[misc]
    assert GenerateRequest.model_validate_json(req.model_dump_json()) == req


@pytest.mark.parametrize("bad", [{"max_tokens": 0}, {"max_tokens": 1, "temperature": -1},
                                 {"max_tokens": 1, "top_p": 0}, {"max_tokens": 1, "stop": ("",)},
                                 {"max_tokens": 1, "stop": ("a", "b", "c", "d", "e")}])
def test_sampling_bounds(bad):
    with pytest.raises(ValidationError):
        SamplingParams(**bad)


def test_stream_events_decode_by_kind():
    ev = TokenChunk(request_id="r", seq=0, token_ids=(1,), text="a", emitted_unix_ms=0)
    assert STREAM_EVENT.validate_json(ev.model_dump_json()) == ev


@given(st.text(min_size=1, max_size=40))
def test_subject_tokens_are_single_tokens_and_invertible(name):
    tok = subjects.token(name)
    assert "." not in tok and "*" not in tok and ">" not in tok and " " not in tok
    assert subjects.untoken(tok) == name


def test_distinct_names_never_share_a_subject():
    assert subjects.req("a.b") != subjects.req("a_b") != subjects.req("a~2eb")


def test_every_route_has_a_json_schema():
    for route in ROUTES:
        if route.payload is not None:
            schema = json_schema(route.payload)
            assert schema.get("properties") or schema.get("oneOf") or schema.get("anyOf")


def test_janus_contracts_prints_every_subject_with_its_schema():
    out = subprocess.run([sys.executable, "-m", "ops.cli", "contracts", "--json"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    routes = json.loads(out)
    assert {r["subject"] for r in routes} == {r.subject for r in ROUTES}
    req = next(r for r in routes if r["subject"] == "janus.req.<model>")
    assert "prompt_token_ids" in req["payload"]["properties"]
