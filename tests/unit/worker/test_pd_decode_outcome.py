"""The decode side of a P/D hand-over starts its track past the first token: that token's on-time status comes
from when the prefill instance emitted it (the hand-over's dispatched_unix_ms) and the request's TTFT deadline."""
from __future__ import annotations

from pathlib import Path

import pytest

from contracts import GenerateRequest, InstanceRole, KVTarget, MovedStream, Pool, RunAssignment, SamplingParams
from worker.core.streaming import RequestTrack
from worker.dataplane.pd_flow import PrefillDecodeFlow
from worker.lifecycle.instance import ModelInstance, Reservation

DEADLINE_MS = 1000.0


class Engine:
    def add_migrated_decode(self, request_id, prompt, output_token_ids, sampling, block_ids) -> None:
        self.added = (request_id, prompt, output_token_ids)


class Host:
    """The part of the worker shell the decode side uses when it admits a hand-over."""

    worker_id = "w-d"
    bus = None
    transfer = None
    pages = None

    def __init__(self) -> None:
        self.tracks: list[RequestTrack] = []

    def track(self, inst, track: RequestTrack) -> None:
        self.tracks.append(track)

    def wake_engines(self) -> None:
        pass


def _admit(first_token_ms: float, moved: MovedStream | None = None) -> RequestTrack:
    host = Host()
    inst = ModelInstance(worker_id="w-d", model="m", instance_id="d-1", role=InstanceRole.DECODE,
                         pool_kind=Pool.ELASTIC, model_dir=Path("."), pages=None, build_engine=None)
    inst.engine = Engine()
    target = KVTarget(decode_worker_id="w-d", decode_instance_id="d-1", transfer_session="s",
                      block_offsets_bytes=(0,), block_num_bytes=16)
    num_kv_tokens = 2 if moved is None else 2 + len(moved.output_token_ids) - 1
    inst.reservations["r"] = Reservation("r", (0,), num_kv_tokens, target, 0.0)
    prompt = (5, 6, 42) if moved is None else (5, 6)  # P/D: the first token rides at the prompt's end
    req = GenerateRequest(request_id="r", model="m", prompt_token_ids=prompt, sampling=SamplingParams(max_tokens=40),
                          arrival_unix_ms=0.0, ttft_deadline_unix_ms=DEADLINE_MS, tpot_slo_ms=25.0,
                          reply_subject="janus.reply.g.r")
    PrefillDecodeFlow(host)._admit(RunAssignment(request=req, instance_id="d-1", phase="decode", kv_target=target,
                                                 dispatched_unix_ms=first_token_ms, moved=moved), inst)
    (track,) = host.tracks
    assert inst.engine.added[:2] == ("r", [5, 6]) and not inst.reservations
    return track


@pytest.mark.parametrize("first_token_ms,num_on_time", [(DEADLINE_MS - 1.0, 1), (DEADLINE_MS, 1),
                                                        (DEADLINE_MS + 1.0, 0)])
def test_the_first_token_counts_as_the_prefill_instance_emitted_it(first_token_ms, num_on_time):
    track = _admit(first_token_ms)
    assert (track.num_output_tokens, track.num_on_time_tokens) == (1, num_on_time)
    assert (track.ttft_deadline_unix_ms, track.tpot_slo_ms) == (DEADLINE_MS, 25.0)
    assert track.num_tokens_by_choice == {0: 1}  # the next token is token 2, due by the deadline + 1 TPOT


def test_a_moved_decode_continues_the_stream_where_it_stood():
    moved = MovedStream(output_token_ids=(42, 43, 44, 45), next_seq=4, first_token_unix_ms=DEADLINE_MS - 5.0,
                        num_on_time_tokens=3)
    track = _admit(first_token_ms=2e9, moved=moved)  # its dispatched_unix_ms is not the first token's time
    assert (track.next_seq, track.num_output_tokens, track.num_on_time_tokens) == (4, 4, 3)
    assert track.first_token_unix_ms == DEADLINE_MS - 5.0 and track.num_tokens_by_choice == {0: 4}
    assert track.extra["request"].prompt_token_ids == (5, 6)  # what a later move takes along
