"""Decode routing for prefill/decode-disaggregated instances: the ready decode instance with the least backlog.

Backlog = sequences the decode instance last reported (waiting + running, from its heartbeat) + requests this
dispatcher sent its way that the report cannot include yet (their prefill had not finished when it was sent).
"""
from __future__ import annotations

from typing import Iterable

from contracts import InstanceRecord


class DecodeBacklog:
    def __init__(self) -> None:
        self._reported: dict[str, tuple[float, int]] = {}  # instance -> (report ms, sequences)
        # instance -> request -> when its prefill finished (None: not yet, so no report can count it)
        self._sent: dict[str, dict[str, float | None]] = {}
        self._instance_of: dict[str, str] = {}
        # instance -> reported + len(sent), kept up to date: every assignment reads it for every candidate
        self._backlog: dict[str, int] = {}

    def backlog(self, instance_id: str) -> int:
        return self._backlog.get(instance_id, 0)

    def choose(self, candidates: Iterable[InstanceRecord]) -> InstanceRecord | None:
        """Least backlog; ties by the fuller share of max_num_seqs, then instance id (deterministic)."""
        backlog = self._backlog.get
        best: InstanceRecord | None = None
        best_num = 0
        # the key (num, num / max_num_seqs, id) compared piece by piece, without building it per candidate: every
        # P/D assignment runs this over all of a model's decode instances (5 % of a simulated Janus run)
        for record in candidates:
            num = backlog(record.instance_id, 0)
            if best is None or num < best_num:
                best, best_num = record, num
            elif num == best_num:
                if num == 0:  # every share is 0: the id decides
                    if record.instance_id < best.instance_id:
                        best = record
                    continue
                share, best_share = num / record.max_num_seqs, num / best.max_num_seqs
                if share < best_share or (share == best_share and record.instance_id < best.instance_id):
                    best = record
        return best

    def record_sent(self, instance_id: str, request_id: str) -> None:
        self._sent.setdefault(instance_id, {})[request_id] = None
        self._instance_of[request_id] = instance_id
        self._backlog[instance_id] = self._backlog.get(instance_id, 0) + 1

    def record_prefill_done(self, request_id: str, now_ms: float) -> None:
        instance_id = self._instance_of.get(request_id)
        if instance_id is not None:
            self._sent[instance_id][request_id] = now_ms

    def forget_request(self, request_id: str) -> None:
        instance_id = self._instance_of.pop(request_id, None)
        if instance_id is not None and self._sent[instance_id].pop(request_id, False) is not False:
            self._backlog[instance_id] -= 1

    def report(self, instance_id: str, sent_ms: float, num_seqs: int) -> None:
        """A heartbeat: the instance held num_seqs at sent_ms. Sent requests whose KV arrived before then are in it."""
        last = self._reported.get(instance_id)
        if last is not None and last[0] > sent_ms:
            return  # out-of-order heartbeat
        self._reported[instance_id] = (sent_ms, num_seqs)
        sent = self._sent.get(instance_id)
        if sent:
            for request_id in [rid for rid, done_ms in sent.items() if done_ms is not None and done_ms <= sent_ms]:
                del sent[request_id]
                self._instance_of.pop(request_id, None)
        self._backlog[instance_id] = num_seqs + len(sent or ())

    def forget_instance(self, instance_id: str) -> None:
        self._reported.pop(instance_id, None)
        self._backlog.pop(instance_id, None)
        for request_id in self._sent.pop(instance_id, {}):
            self._instance_of.pop(request_id, None)
