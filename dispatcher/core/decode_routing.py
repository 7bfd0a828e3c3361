"""Decode routing for prefill/decode-disaggregated instances: the ready decode instance with the least backlog.

Backlog = sequences the decode instance last reported (waiting + running, from its heartbeat) + requests this
dispatcher sent its way that the report cannot include yet (their prefill had not finished when it was sent).
"""
from __future__ import annotations

import heapq
from itertools import count
from typing import Sequence

from contracts import InstanceRecord


class _LeastBacklogHeap:
    """One model's decode candidates in a lazy min-heap on the routing key. An entry (num, share, id, seq, record)
    is current while num is still the instance's backlog; every change of a candidate's backlog pushes a current
    entry, and stale ones are dropped when they reach the top. So the top current entry is the key's minimum."""

    __slots__ = ("candidates", "ids", "heap")

    def __init__(self, candidates: Sequence[InstanceRecord], backlog, seq: count) -> None:
        self.candidates = candidates
        self.ids = {r.instance_id: r for r in candidates}
        self.heap: list = []
        self.rebuild(backlog, seq)

    def rebuild(self, backlog, seq: count) -> None:
        self.heap = [(num, num / r.max_num_seqs, r.instance_id, next(seq), r)
                     for r in self.candidates for num in (backlog(r.instance_id, 0),)]
        heapq.heapify(self.heap)

    def push(self, record: InstanceRecord, num: int, seq: count) -> None:
        heapq.heappush(self.heap, (num, num / record.max_num_seqs, record.instance_id, next(seq), record))


class DecodeBacklog:
    def __init__(self) -> None:
        self._reported: dict[str, tuple[float, int]] = {}  # instance -> (report ms, sequences)
        # instance -> request -> when its prefill finished (None: not yet, so no report can count it)
        self._sent: dict[str, dict[str, float | None]] = {}
        self._instance_of: dict[str, str] = {}
        # instance -> reported + len(sent), kept up to date: every assignment reads it for every candidate
        self._backlog: dict[str, int] = {}
        # model -> its candidates' heap, for `choose` on the same candidate tuple again (the registry's cached one)
        self._heaps: dict[str, _LeastBacklogHeap] = {}
        self._model_of: dict[str, str] = {}  # instance -> the model whose heap lists it
        self._seq = count()  # a unique last key: equal entries never compare their records

    def backlog(self, instance_id: str) -> int:
        return self._backlog.get(instance_id, 0)

    def choose(self, candidates: Sequence[InstanceRecord]) -> InstanceRecord | None:
        """Least backlog; ties by the fuller share of max_num_seqs, then instance id (deterministic). Candidates are
        one model's instances. Asked again with the same tuple (the registry's cached one: tuples cannot change),
        the answer comes from a heap kept up to date with every change of backlog, not a scan: a P/D assignment
        runs this over all of a model's decode instances, up to hundreds (5 % of a simulated Janus run as a scan)."""
        if not candidates:
            return None
        backlog = self._backlog.get
        model = candidates[0].model
        index = self._heaps.get(model)
        if index is None or index.candidates is not candidates:
            replaced, index = index, _LeastBacklogHeap(candidates, backlog, self._seq)
            if isinstance(candidates, tuple):
                self._heaps[model] = index
                if replaced is not None:
                    for instance_id in replaced.ids.keys() - index.ids.keys():
                        self._model_of.pop(instance_id, None)
                self._model_of.update((r.instance_id, model) for r in candidates)
        elif len(index.heap) > 4 * len(candidates) + 64:
            index.rebuild(backlog, self._seq)  # mostly stale entries: start over
        heap = index.heap
        while backlog(heap[0][2], 0) != heap[0][0]:
            heapq.heappop(heap)
        return heap[0][4]

    def _set_backlog(self, instance_id: str, num: int | None) -> None:
        """The one place a backlog changes (None: forgotten, which counts as 0); the heap holding the instance gets
        its current entry."""
        if num is None:
            self._backlog.pop(instance_id, None)
        else:
            self._backlog[instance_id] = num
        index = self._heaps.get(self._model_of.get(instance_id, ""))
        if index is not None:
            record = index.ids.get(instance_id)
            if record is not None:
                index.push(record, num or 0, self._seq)

    def record_sent(self, instance_id: str, request_id: str) -> None:
        self._sent.setdefault(instance_id, {})[request_id] = None
        self._instance_of[request_id] = instance_id
        self._set_backlog(instance_id, self._backlog.get(instance_id, 0) + 1)

    def record_prefill_done(self, request_id: str, now_ms: float) -> None:
        instance_id = self._instance_of.get(request_id)
        if instance_id is not None:
            self._sent[instance_id][request_id] = now_ms

    def forget_request(self, request_id: str) -> None:
        """The request left the instance (it finished, was cancelled or failed). Counted as sent, it stops counting
        at once; counted in a heartbeat's figure, it stays until the next heartbeat says what is left (it cannot
        be taken out of that figure without knowing whether the figure held it)."""
        instance_id = self._instance_of.pop(request_id, None)
        if instance_id is not None and self._sent[instance_id].pop(request_id, False) is not False:
            self._set_backlog(instance_id, self._backlog[instance_id] - 1)

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
        num = num_seqs + len(sent or ())
        if self._backlog.get(instance_id) != num:
            self._set_backlog(instance_id, num)

    def forget_instance(self, instance_id: str) -> None:
        self._reported.pop(instance_id, None)
        self._set_backlog(instance_id, None)
        for request_id in self._sent.pop(instance_id, {}):
            self._instance_of.pop(request_id, None)
