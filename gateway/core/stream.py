"""Puts a request's stream events back in order, drops duplicates, and stops at the one terminal event."""
from __future__ import annotations

from contracts import RequestDone, RequestFailed, TokenChunk

Event = TokenChunk | RequestDone | RequestFailed


class StreamAssembler:
    def __init__(self) -> None:
        self.next_seq = 0
        self._held: dict[int, Event] = {}
        self.is_terminal = False
        self.num_duplicates = 0
        self._gap_since_s: float | None = None

    def gap_age_s(self, now_s: float) -> float:
        """How long events have waited behind a missing one (0 without a gap). A bus failover can lose a message
        in flight (NATS core is at-most-once); the caller ends a request whose gap does not close."""
        return 0.0 if self._gap_since_s is None else now_s - self._gap_since_s

    def note_time(self, now_s: float) -> None:
        if self._held and self._gap_since_s is None:
            self._gap_since_s = now_s
        elif not self._held:
            self._gap_since_s = None

    def push(self, event: Event) -> list[Event]:
        """Events now deliverable in order. A terminal event ends the stream; nothing after it is delivered.

        A failure ends the stream at once, whatever its number: it may come from someone other than the worker
        that streamed (a dispatcher reporting that worker dead), and nothing more will come from a dead worker."""
        if self.is_terminal:
            self.num_duplicates += 1
            return []
        if isinstance(event, RequestFailed):
            ready = [self._held.pop(s) for s in sorted(self._held) if isinstance(self._held[s], TokenChunk)]
            self._held.clear()
            self.is_terminal = True
            return ready + [event]
        if event.seq < self.next_seq or event.seq in self._held:
            self.num_duplicates += 1
            return []
        self._held[event.seq] = event
        ready: list[Event] = []
        while self.next_seq in self._held:
            ev = self._held.pop(self.next_seq)
            self.next_seq += 1
            ready.append(ev)
            if not isinstance(ev, TokenChunk):
                self.is_terminal = True
                self._held.clear()
                break
        return ready
