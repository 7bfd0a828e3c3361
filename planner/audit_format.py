"""How `janus audit` shows a PLANS event: one line of text per event (with its reason), or one JSON object."""
from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone

from pydantic import BaseModel

from contracts import ElasticPlan, PlanAction, PlanStatus, SteadyPlan, subjects

KIND_OF_SUBJECT = {subjects.PLAN_STEADY: "steady", subjects.PLAN_ELASTIC: "elastic", subjects.PLAN_ACTION: "action",
                   subjects.PLAN_STATUS: "status"}
TYPE_OF_KIND: dict[str, type[BaseModel]] = {"steady": SteadyPlan, "elastic": ElasticPlan, "action": PlanAction,
                                            "status": PlanStatus}


def parse_event(subject: str, data: bytes) -> tuple[str, BaseModel]:
    """(kind, payload) of a PLANS message; ValueError for a subject or payload this build does not know."""
    kind = KIND_OF_SUBJECT.get(subject)
    if kind is None:
        raise ValueError(f"unknown PLANS subject {subject}")
    return kind, TYPE_OF_KIND[kind].model_validate_json(data)


def parse_since(text: str, now: datetime) -> datetime:
    """`2026-01-02T03:04:05Z` (any ISO-8601) or a duration back from now: `90s`, `10m`, `2h`, `1d`."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", text)
    if m:
        unit = {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
        return now - timedelta(seconds=float(m.group(1)) * unit)
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"--since takes an ISO-8601 time or a duration like 10m, got {text!r}") from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def _clock(unix_ms: float) -> str:
    return datetime.fromtimestamp(unix_ms / 1000.0, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _versions(preds) -> str:
    versions = sorted({f"{p.model_version} ({p.source})" for p in preds})
    return ", ".join(versions) if versions else "-"


def format_text(kind: str, event: BaseModel) -> str:
    if kind == "steady":
        p: SteadyPlan = event  # type: ignore[assignment]
        bins = " ".join(f"{b.worker_id}[{','.join(b.models)}]" for b in p.bins)
        moves = "; ".join(f"{m.model} {m.from_worker_id or '-'}->{m.to_worker_id or '-'} ({m.reason})"
                          for m in p.moves) or "none"
        flag = " OBSERVE-ONLY" if p.is_observe_only else ""
        return (f"{_clock(p.created_unix_ms)} steady  {p.plan_id} {p.trigger}{flag}: {len(p.bins)} device(s) {bins}"
                f" | elastic: {', '.join(p.elastic_models) or '-'} | moves: {moves} | why: {p.reason}"
                f" | oracle: {_versions(p.predictions)} | {p.decision_ms:.1f} ms")
    if kind == "elastic":
        e: ElasticPlan = event  # type: ignore[assignment]
        targets = "; ".join(
            f"{t.model} {t.num_prefill}P/{t.num_decode}D (m*={t.desired_replicas}: {t.reason})" for t in e.targets
            if t.desired_replicas or t.num_prefill or t.num_decode) or "no traffic"
        flags = "".join(f" {f}" for f, on in (("SCALED-DOWN", e.is_scaled_down), ("DEBOUNCED", e.is_debounced),
                                              ("OBSERVE-ONLY", e.is_observe_only)) if on)
        preds = [t.prediction for t in e.targets if t.prediction is not None]
        return (f"{_clock(e.created_unix_ms)} elastic {e.plan_id}{flags}: {e.num_devices_used}/{e.budget_devices} "
                f"devices | {targets} | why: {e.reason} | oracle: {_versions(preds)} | {e.decision_ms:.1f} ms")
    if isinstance(event, PlanStatus):
        detail = f" ({event.detail})" if event.detail else ""
        return f"{_clock(event.unix_ms)} status  {event.plan_id} [{event.kind}]: {event.status}{detail}"
    a: PlanAction = event  # type: ignore[assignment]
    err = f" [{a.error.code.value}: {a.error.message}]" if a.error else ""
    return (f"{_clock(a.unix_ms)} action  {a.plan_id} {a.action.value} {a.instance_id} on {a.worker_id}: "
            f"{a.status} (attempt {a.attempt}) {a.reason}{err}")


def format_json(kind: str, event: BaseModel, seq: int, subject: str) -> str:
    return json.dumps({"seq": seq, "subject": subject, "kind": kind, "event": event.model_dump(mode="json")},
                      separators=(",", ":"))


def plan_id_of(event: BaseModel) -> str:
    return getattr(event, "plan_id", "")
