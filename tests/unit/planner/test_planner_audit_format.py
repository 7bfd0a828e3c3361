"""How `janus audit` reads and shows PLANS events."""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from planner_test_oracles import TableOracle, window

from contracts import LifecycleAction, PlanAction, subjects
from planner.audit_format import format_json, format_text, parse_event, parse_since
from planner.core.elastic import ElasticScaler
from planner.core.steady import SteadyPlanner


def test_since_takes_durations_and_iso_times():
    now = datetime(2026, 1, 2, 12, 0, tzinfo=timezone.utc)
    assert parse_since("10m", now) == now - timedelta(minutes=10)
    assert parse_since("1.5h", now) == now - timedelta(minutes=90)
    assert parse_since("2026-01-02T03:04:05Z", now) == datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    assert parse_since("2026-01-02T03:04:05", now).tzinfo == timezone.utc
    with pytest.raises(ValueError, match="duration"):
        parse_since("yesterday", now)


def test_events_round_trip_and_show_their_reasons():
    oracle = TableOracle(needs={"a": (0.3, 0.2, 0.1), "big": (0.8, 0.2, 0.2)}, version="cap-v9")
    steady = SteadyPlanner(oracle).plan(1_700_000_000_000.0, ["a", "big"], ["w0", "w1"]).plan
    scaler = ElasticScaler(oracle)
    scaler.observe(window("big", 20.0, 0.0))
    elastic = scaler.tick(1_700_000_000_500.0, ["big"], budget_devices=1).plan
    action = PlanAction(plan_id=elastic.plan_id, command_id="c1", worker_id="w1", model="big",
                        instance_id="big@w1/colocated", action=LifecycleAction.FORK_FROM, status="retrying",
                        attempt=2, reason="worker said no", unix_ms=1_700_000_001_000.0)
    for subject, event in ((subjects.PLAN_STEADY, steady), (subjects.PLAN_ELASTIC, elastic),
                           (subjects.PLAN_ACTION, action)):
        kind, parsed = parse_event(subject, event.model_dump_json().encode())
        assert parsed == event
        line = format_text(kind, parsed)
        assert "\n" not in line and event.plan_id in line
        obj = json.loads(format_json(kind, parsed, 7, subject))
        assert obj["seq"] == 7 and obj["kind"] == kind and obj["event"]["plan_id"] == event.plan_id
    assert "big" in format_text("steady", steady) and "cap-v9 (test)" in format_text("steady", steady)
    assert "SCALED-DOWN" in format_text("elastic", elastic) and "m*=" in format_text("elastic", elastic)
    assert "retrying (attempt 2) worker said no" in format_text("action", action)
    with pytest.raises(ValueError, match="unknown"):
        parse_event("janus.plan.other", b"{}")
