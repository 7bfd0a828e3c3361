"""The planners' Prometheus series, set from the events they publish (one source of truth for both)."""
from __future__ import annotations

from contracts import ElasticPlan, PlanAction, PlanStatus, SteadyPlan
from runtime.metrics import counter, gauge

DECISION_S = gauge("janus_planner_decision_seconds", "time the latest plan took to decide", ("planner",))
POOL_DEVICES = gauge("janus_planner_pool_devices", "devices each pool uses in the latest plan", ("pool",))
POOL_MODELS = gauge("janus_planner_pool_models", "models in each pool in the latest plan", ("pool",))
ELASTIC_BUDGET = gauge("janus_planner_elastic_budget_devices", "devices the steady pool leaves to the elastic pool")
MOVES = counter("janus_planner_moves_total", "models moved between devices by steady plans")
PLANS = counter("janus_planner_plans_total", "plans published", ("planner",))
ACTIONS = counter("janus_planner_actions_total", "reconciler commands and their outcomes", ("action", "status"))
PLAN_STATUSES = counter("janus_planner_plan_statuses_total", "plans done, superseded, blocked, ignored",
                        ("kind", "status"))


def observe_event(event: object) -> None:
    if isinstance(event, SteadyPlan):
        PLANS.labels("steady").inc()
        DECISION_S.labels("steady").set(event.decision_ms / 1e3)
        POOL_DEVICES.labels("steady").set(len(event.bins))
        POOL_MODELS.labels("steady").set(len(event.steady_models))
        POOL_MODELS.labels("elastic").set(len(event.elastic_models))
        MOVES.inc(len(event.moves))
    elif isinstance(event, ElasticPlan):
        PLANS.labels("elastic").inc()
        DECISION_S.labels("elastic").set(event.decision_ms / 1e3)
        POOL_DEVICES.labels("elastic").set(event.num_devices_used)
        ELASTIC_BUDGET.set(event.budget_devices)
    elif isinstance(event, PlanAction):
        ACTIONS.labels(event.action.value, event.status).inc()
    elif isinstance(event, PlanStatus):
        PLAN_STATUSES.labels(event.kind, event.status).inc()
