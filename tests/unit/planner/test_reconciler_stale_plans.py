"""Plans carry their planner leader's epoch (planner/leader.py); the reconciler acts on a plan only if no newer term
of the same planner has planned (planner/core/reconciler.py). A planner that paused past its lease and woke up may
still publish the plan it was making; its workers would otherwise be driven back to a deposed leader's counts."""
from __future__ import annotations

from test_planner_reconciler import boot, converge, elastic, steady

from contracts import LifecycleAction

UP = (LifecycleAction.ACTIVATE, LifecycleAction.FORK_FROM)


def _statuses(effects, plan_id: str) -> list[str]:
    return [s.status for s in effects.plan_statuses if s.plan_id == plan_id]


def test_a_plan_of_an_older_term_is_ignored_and_a_newer_one_is_acted_on():
    rec, workers = boot(["w0", "w1", "w2", "w3"])
    first = elastic("term3", {"hot": (1, 0)}).model_copy(update={"epoch": 3})
    converge(rec, workers, rec.on_elastic_plan(0.0, first).commands, 0.0)
    assert sum(1 for insts in workers.instances.values() for st in insts.values() if st.model == "hot") == 1

    stale = elastic("term2", {"hot": (3, 0), "cold": (1, 0)}).model_copy(update={"epoch": 2})
    effects = rec.on_elastic_plan(10.0, stale)
    assert _statuses(effects, "term2") == ["ignored"]
    assert "stale epoch 2" in effects.plan_statuses[0].detail and "epoch 3 leads" in effects.plan_statuses[0].detail
    assert not [c for c in effects.commands if c.action in UP], "nothing started for the deposed term's plan"
    assert not _statuses(effects, "term3"), "the current plan is not superseded by a stale one"

    newer = elastic("term4", {"hot": (2, 0)}).model_copy(update={"epoch": 4})
    effects = rec.on_elastic_plan(20.0, newer)
    assert [c.model for c in effects.commands if c.action in UP] == ["hot"]


def test_terms_are_per_planner_and_an_unelected_plan_is_refused_after_an_elected_one():
    rec, workers = boot(["w0", "w1"])
    converge(rec, workers, rec.on_elastic_plan(0.0, elastic("e", {"hot": (1, 0)}).model_copy(
        update={"epoch": 7})).commands, 0.0)
    # the steady planner has its own lease: its epoch 1 is not older than the elastic scaler's 7
    effects = rec.on_steady_plan(5.0, steady("s", {"w1": ("tail",)}).model_copy(update={"epoch": 1}))
    assert "ignored" not in _statuses(effects, "s")
    # epoch 0 (a test or a tool, unelected) once an elected scaler has planned: refused, as workers do
    effects = rec.on_elastic_plan(6.0, elastic("tool", {"hot": (0, 0)}))
    assert _statuses(effects, "tool") == ["ignored"]
