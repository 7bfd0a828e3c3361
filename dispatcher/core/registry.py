"""The dispatcher's view of the instance registry: which instances may be routed to, and each one's EPDT ledger."""
from __future__ import annotations

from typing import Iterable

from contracts import InstanceRecord, InstanceRole, ModelState

from .epdt import PrefillLedger

_PREFILL_ROLES = (InstanceRole.COLOCATED, InstanceRole.PREFILL)


class InstanceView:
    """The latest registry snapshot, minus instances this dispatcher has seen die since."""

    def __init__(self) -> None:
        self._records: dict[str, InstanceRecord] = {}
        self._ledgers: dict[str, PrefillLedger] = {}
        self._lost_at_ms: dict[str, float] = {}
        # routable instances per (model, role group): rebuilt lazily after any change to records or bans, since a
        # dispatch round asks for them on every arrival and the registry changes far less often
        self._routable: dict[tuple[str, str], tuple[InstanceRecord, ...] | tuple[PrefillLedger, ...] | bool] = {}

    def update(self, now_ms: float, records: Iterable[InstanceRecord]) -> list[str]:
        """Replace the snapshot. Returns instances to treat as lost: FAILED, or gone while still holding prefills
        (their first tokens will never come). Not-ready instances (e.g. DRAINING) keep their work and are only no
        longer routed to."""
        new_records: dict[str, InstanceRecord] = {}
        for record in records:
            if not isinstance(record, InstanceRecord):
                raise TypeError(f"on_instances takes contracts.InstanceRecord, got {type(record).__name__}")
            new_records[record.instance_id] = record
        lost: list[str] = []
        for instance_id, ledger in self._ledgers.items():
            record = new_records.get(instance_id)
            is_gone = record is None and ledger.num_outstanding > 0
            if is_gone or (record is not None and record.state == ModelState.FAILED):
                lost.append(instance_id)
        for instance_id, lost_ms in list(self._lost_at_ms.items()):
            record = new_records.get(instance_id)
            # The ban bridges the time until the registry learns of the death: lifted once the registry shows the
            # instance gone or not ready (it caught up; what it says next is the truth), or with a newer record.
            if (
                record is None
                or not record.is_ready
                or record.state != ModelState.ACTIVE
                or record.updated_unix_ms > lost_ms
            ):
                del self._lost_at_ms[instance_id]
        self._records = new_records
        self._routable.clear()
        for instance_id in [i for i, led in self._ledgers.items() if i not in new_records and not led.num_outstanding]:
            del self._ledgers[instance_id]
        return lost

    def mark_lost(self, now_ms: float, instance_id: str, is_ban: bool) -> list[str]:
        """Forget the requests outstanding on the instance and return them (assignment order). With is_ban (the
        death was detected outside the registry), stop routing to it until the registry catches up."""
        if is_ban:
            self._lost_at_ms[instance_id] = now_ms
            self._routable.clear()
        ledger = self._ledgers.get(instance_id)
        return ledger.clear(now_ms) if ledger is not None else []

    def is_routable(self, instance_id: str) -> bool:
        record = self._records.get(instance_id)
        return (
            record is not None
            and record.is_ready
            and record.state == ModelState.ACTIVE
            and instance_id not in self._lost_at_ms
        )

    def record(self, instance_id: str) -> InstanceRecord | None:
        return self._records.get(instance_id)

    def models(self) -> set[str]:
        return {r.model for r in self._records.values()}

    def decode_instances(self, model: str) -> tuple[InstanceRecord, ...]:
        key = (model, "decode")
        cached = self._routable.get(key)
        if cached is None:
            cached = self._routable[key] = tuple(sorted(
                (r for r in self._records.values()
                 if r.model == model and r.role == InstanceRole.DECODE and self.is_routable(r.instance_id)),
                key=lambda r: r.instance_id))
        return cached

    def prefill_instances(self, model: str) -> tuple[InstanceRecord, ...]:
        """Routable instances that can take a new request's prefill, sorted by id. A PREFILL instance counts only
        while the model has a routable DECODE instance to hand its KV cache to."""
        key = (model, "prefill")
        cached = self._routable.get(key)
        if cached is None:
            has_decode = bool(self.decode_instances(model))
            cached = self._routable[key] = tuple(sorted(
                (r for r in self._records.values()
                 if r.model == model
                 and r.role in _PREFILL_ROLES
                 and (r.role == InstanceRole.COLOCATED or has_decode)
                 and self.is_routable(r.instance_id)),
                key=lambda r: r.instance_id))
        return cached

    def prefill_ledgers(self, model: str) -> tuple[PrefillLedger, ...]:
        """The EPDT ledgers of `prefill_instances(model)`, in the same order (cached with the routable set: every
        round reads every instance's EPDT, and a lookup per instance cost a baseline run a quarter of its time).
        A cached ledger stays the one `ledger()` returns: ledgers are dropped only in `update`, which clears the
        cache."""
        key = (model, "ledgers")
        cached = self._routable.get(key)
        if cached is None:
            cached = self._routable[key] = tuple(self.ledger(r.instance_id) for r in self.prefill_instances(model))
        return cached

    def has_colocated(self, model: str) -> bool:
        """Whether any routable prefill instance of the model is co-located (cached with the routable set)."""
        key = (model, "colocated")
        cached = self._routable.get(key)
        if cached is None:
            cached = self._routable[key] = any(r.role == InstanceRole.COLOCATED for r in self.prefill_instances(model))
        return cached

    def ledger(self, instance_id: str) -> PrefillLedger:
        ledger = self._ledgers.get(instance_id)
        if ledger is None:
            ledger = self._ledgers[instance_id] = PrefillLedger(instance_id)
        return ledger

    def existing_ledger(self, instance_id: str) -> PrefillLedger | None:
        return self._ledgers.get(instance_id)

    def ledgers(self) -> dict[str, PrefillLedger]:
        return self._ledgers
