"""janus.worker.<w>.resend on the bus: a gateway that lost stream events (NATS core is at-most-once; a bus failover
can drop messages in flight) asks the worker that streamed them for everything from its next expected seq. The
answers come from the worker's `StreamLog` (worker/core/stream_log.py); this module only moves messages.
janus.worker.<w>.holds: a dispatcher asks the same log which of its long-unconfirmed assignments the worker holds.
"""
from __future__ import annotations

import logging
from typing import Protocol

from contracts import HoldsQuery, HoldsReply, ResendReply, ResendRequest, subjects
from runtime.bus import Bus, BusError, Envelope

from ..core.stream_log import StreamLog

log = logging.getLogger("janus.worker.resend")

FORWARD_TIMEOUT_S = 1.0  # the gateway waits 2 s for the whole answer
DEFAULT_MAX_PAYLOAD_BYTES = 1 << 20
HEADROOM_BYTES = 4096  # headers and framing around the payload


class ResendHost(Protocol):
    """What answering resends needs of the worker shell (WorkerService), and nothing more."""

    worker_id: str
    bus: Bus
    stream_log: StreamLog


class ResendServer:
    def __init__(self, host: ResendHost) -> None:
        self.host = host
        self.num_answered = 0
        self.num_unknown = 0

    async def answer(self, ask: ResendRequest, env: Envelope) -> ResendReply:
        """Every event streamed for the request from `from_seq` on (none yet, if it runs and nothing new was sent),
        or is_known=False. A prefill worker's part of a P/D request ends at the hand-over: the rest is fetched from
        the decode worker, so a gateway that lost all of the decode side's events (it only knows the prefill
        worker, named in chunk 0) still gets them."""
        self.num_answered += 1
        answer = self.host.stream_log.resend(ask.request_id, ask.from_seq)
        if not answer.is_known:
            self.num_unknown += 1
            return ResendReply(request_id=ask.request_id, is_known=False)
        events = list(answer.events)
        if answer.handed_to_worker_id:
            rest = ResendRequest(request_id=ask.request_id, from_seq=max(ask.from_seq, answer.next_seq))
            try:
                theirs = await self.host.bus.request(subjects.worker_resend(answer.handed_to_worker_id), rest,
                                                    ResendReply, timeout_s=FORWARD_TIMEOUT_S)
            except BusError as exc:  # unreachable for now: answer our part, the gateway asks again
                log.info("%s: resend of %s from %s failed: %s", self.host.worker_id, ask.request_id,
                         answer.handed_to_worker_id, exc.error.message)
            else:
                if not theirs.is_known:
                    self.num_unknown += 1
                    return ResendReply(request_id=ask.request_id, is_known=False)
                events += theirs.events
        return self.fitting_reply(ask.request_id, events)

    async def holds(self, ask: HoldsQuery, env: Envelope) -> HoldsReply:
        """Which of a dispatcher's long-unconfirmed assignments this worker still holds (contracts.HoldsQuery)."""
        started = {rid: self.host.stream_log.has_started(rid) for rid in ask.request_ids}
        return HoldsReply(waiting_ids=tuple(rid for rid, s in started.items() if s is False),
                          started_ids=tuple(rid for rid, s in started.items() if s))

    def fitting_reply(self, request_id: str, events: list) -> ResendReply:
        """The events in order, cut to a prefix that fits one message (the gateway asks again for the rest)."""
        limit = int(getattr(self.host.bus.nc, "max_payload", 0) or DEFAULT_MAX_PAYLOAD_BYTES) - HEADROOM_BYTES
        reply = ResendReply(request_id=request_id, is_known=True, events=tuple(events))
        while len(events) > 1 and len(reply.model_dump_json()) > limit:
            events = events[: len(events) // 2]
            reply = ResendReply(request_id=request_id, is_known=True, events=tuple(events))
        return reply
