"""The events a worker streamed for each request, kept so a gateway that lost some can ask for them again.

NATS core is at-most-once: a nats-server restart or a node failover can drop a token chunk or the terminal event in
flight. The gateway notices (a gap in the sequence numbers, or a long silence) and asks the worker that streamed them
(`janus.worker.<w>.resend`, `contracts.ResendRequest`) for everything from its next expected seq. This log answers.

Pure: plain events in, plain answers out, the clock passed in (monotonic seconds).

- A request's log opens when the worker takes the request (so a running request with nothing new says "known, no
  events yet") and gets every event the worker publishes for it, terminal included.
- It ends when the worker is done with the request (terminal event, or a P/D hand-over: then it notes the decode
  worker), and is kept `retain_s` (60 s) after that.
- Memory is bounded: past `max_num_events` in all, the oldest finished logs go first (their older events, then
  their last few, which a gateway that lost the end of a stream asks for); if running requests alone exceed it, the
  oldest running logs lose their oldest events (a later ask from before what is left is answered "not known": the
  stream cannot be completed from here).
- A request handed back before its first token (it moves elsewhere) is forgotten at once.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from contracts import RequestDone, RequestFailed, StreamEvent

DEFAULT_RETAIN_S = 60.0
# ~1.2 KiB each as Python objects (measured): ~60 MiB at most. At 5000 tokens/s a worker then keeps ~10 s of
# finished streams rather than 60 s; a gateway asks within seconds of a gap.
DEFAULT_MAX_NUM_EVENTS = 50_000
FINISHED_TAIL_EVENTS = 16  # what a finished log keeps longest when memory is short


@dataclass
class _RequestLog:
    events: deque = field(default_factory=deque)
    first_seq: int = 0  # the first seq this worker streams (P/D decode side: 1)
    next_seq: int = 0
    is_truncated: bool = False  # lost its oldest events to the cap: asks from before `first_seq` are unanswerable
    finished_s: float | None = None
    handed_to_worker_id: str = ""


@dataclass(frozen=True)
class ResendAnswer:
    """What the log can say about one request from `from_seq` on."""

    is_known: bool
    events: tuple[StreamEvent, ...] = ()
    # P/D: the prefill worker's part ends at its hand-over; later events are the decode worker's to resend
    handed_to_worker_id: str = ""
    next_seq: int = 0  # the first seq this worker did not stream


class StreamLog:
    def __init__(self, *, retain_s: float = DEFAULT_RETAIN_S, max_num_events: int = DEFAULT_MAX_NUM_EVENTS) -> None:
        if retain_s < 0 or max_num_events < 1:
            raise ValueError("retain_s must be >= 0 and max_num_events >= 1")
        self.retain_s = retain_s
        self.max_num_events = max_num_events
        self._logs: dict[str, _RequestLog] = {}
        self._finished: OrderedDict[str, float] = OrderedDict()  # request id -> finish time, oldest first
        self._num_events = 0
        self.num_dropped_events = 0

    @property
    def num_events(self) -> int:
        return self._num_events

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._logs

    def open(self, request_id: str, first_seq: int = 0) -> None:
        """The worker took the request; its events start at `first_seq` (P/D decode side: 1). A request taken again
        (re-dispatched here) starts a fresh log, but a decode instance continuing what a prefill instance of this
        same worker streamed so far continues its log."""
        log = self._logs.get(request_id)
        if log is not None and log.finished_s is None and 0 < first_seq == log.next_seq:
            return
        self._drop(request_id)
        self._logs[request_id] = _RequestLog(first_seq=first_seq, next_seq=first_seq)

    def record(self, request_id: str, events: Iterable[StreamEvent], now_s: float) -> None:
        """Events just published for the request, in seq order. A terminal event ends the log's request."""
        events = list(events)
        if not events:
            return
        log = self._logs.get(request_id)
        if log is None:  # events of a request never opened (an error answered at once): log them all the same
            self.open(request_id)
            log = self._logs[request_id]
        for event in events:
            log.events.append(event)
            log.next_seq = max(log.next_seq, event.seq + 1)
            self._num_events += 1
            if isinstance(event, (RequestDone, RequestFailed)):
                self.finish(request_id, now_s)
        self._enforce_cap()

    def finish(self, request_id: str, now_s: float, *, handed_to_worker_id: str = "") -> None:
        """This worker streams nothing more for the request (done, failed, or handed over to another worker)."""
        log = self._logs.get(request_id)
        if log is None or log.finished_s is not None:
            return
        log.finished_s = now_s
        log.handed_to_worker_id = handed_to_worker_id
        self._finished[request_id] = now_s

    def forget(self, request_id: str) -> None:
        """The request left this worker before anything was streamed (handed back): nothing to answer for."""
        self._drop(request_id)

    def resend(self, request_id: str, from_seq: int) -> ResendAnswer:
        """Every event from `from_seq` on, in order; not known when the worker never had the request, forgot it,
        or no longer has all of what was asked for."""
        if from_seq < 0:
            raise ValueError("from_seq must be >= 0")
        log = self._logs.get(request_id)
        if log is None or (log.is_truncated and from_seq < log.first_seq):
            return ResendAnswer(False)
        events = tuple(e for e in log.events if e.seq >= from_seq)
        return ResendAnswer(True, events, log.handed_to_worker_id, log.next_seq)

    def has_started(self, request_id: str) -> bool | None:
        """None: not known (never taken, handed back, or forgotten); False: taken, nothing streamed yet; True:
        something streamed, or finished."""
        log = self._logs.get(request_id)
        if log is None:
            return None
        return log.finished_s is not None or log.next_seq > log.first_seq

    def expire(self, now_s: float) -> int:
        """Forget requests finished more than `retain_s` ago. Returns how many."""
        num = 0
        while self._finished:
            request_id, finished_s = next(iter(self._finished.items()))
            if now_s - finished_s <= self.retain_s:
                break
            self._drop(request_id)
            num += 1
        return num

    # ---- internals ----------------------------------------------------------------------------------------------
    def _drop(self, request_id: str) -> None:
        log = self._logs.pop(request_id, None)
        if log is not None:
            self._num_events -= len(log.events)
        self._finished.pop(request_id, None)

    def _enforce_cap(self) -> None:
        """Over the cap: finished logs (oldest first) lose their older events down to a short tail (a gateway asks from
        just past what it has, near the end), then go whole; then running logs (oldest first) lose their oldest."""
        if self._num_events <= self.max_num_events:
            return  # the common case, on every event: nothing to walk
        finished = [self._logs[rid] for rid in self._finished]
        for log in finished:
            self._truncate_front(log, keep=FINISHED_TAIL_EVENTS)
        while self._num_events > self.max_num_events and self._finished:
            request_id = next(iter(self._finished))
            self.num_dropped_events += len(self._logs[request_id].events)
            self._drop(request_id)
        for log in self._running_oldest_first():
            self._truncate_front(log, keep=0)

    def _truncate_front(self, log: _RequestLog, keep: int) -> None:
        while self._num_events > self.max_num_events and len(log.events) > keep:
            log.events.popleft()
            self._num_events -= 1
            self.num_dropped_events += 1
            log.is_truncated = True
            log.first_seq = log.events[0].seq if log.events else log.next_seq

    def _running_oldest_first(self) -> Sequence[_RequestLog]:
        return [log for log in self._logs.values() if log.finished_s is None]  # dicts keep insertion order
