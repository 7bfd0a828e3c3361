"""An engine that skips the model math: it streams the prompt's own tokens back (cycling), one per step.

For measuring what the serving path itself costs (bench/bus.py) and for load tests of the shells; it honours the
engine interface the worker uses (add_request / abort / step / has_unfinished / stats). Never the default.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Sequence

from contracts import SamplingParams


@dataclass
class EchoOutput:
    request_id: str
    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[float, ...] | None
    is_finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int = 0  # the echo engine caches nothing


@dataclass
class EchoStats:
    num_waiting: int = 0
    num_running: int = 0
    num_kv_blocks_used: int = 0
    num_kv_blocks_free: int = 0
    ttft_ms_p50: float | None = None
    tpot_ms_p50: float | None = None
    prefill_tokens_per_s: float | None = None
    decode_tokens_per_s: float | None = None


@dataclass
class _Req:
    request_id: str
    prompt: list[int]
    max_tokens: int
    num_out: int = 0
    is_aborted: bool = False


class EchoEngine:
    def __init__(self, max_model_len: int = 4096) -> None:
        self.max_model_len = max_model_len
        self._inbox: list[_Req] = []
        self._aborts: set[str] = set()
        self._running: dict[str, _Req] = {}
        self._lock = threading.Lock()

    def add_request(self, request_id: str, prompt_token_ids: Sequence[int], sampling: SamplingParams) -> None:
        with self._lock:
            self._inbox.append(_Req(request_id, list(prompt_token_ids), sampling.max_tokens))

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._aborts.add(request_id)

    def has_unfinished(self) -> bool:
        with self._lock:
            return bool(self._inbox or self._running or self._aborts)

    def step(self) -> list[EchoOutput]:
        with self._lock:
            for req in self._inbox:
                self._running[req.request_id] = req
            self._inbox.clear()
            aborts, self._aborts = self._aborts, set()
        outputs = []
        for rid in aborts:
            req = self._running.pop(rid, None)
            if req is not None:
                outputs.append(EchoOutput(rid, (), "", None, True, "abort", len(req.prompt), req.num_out))
        for rid, req in list(self._running.items()):
            token = req.prompt[req.num_out % len(req.prompt)]
            req.num_out += 1
            is_done = req.num_out >= req.max_tokens
            outputs.append(EchoOutput(rid, (token,), f"<{token}>", None, is_done, "length" if is_done else None,
                                      len(req.prompt), req.num_out))
            if is_done:
                del self._running[rid]
        return outputs

    def stats(self) -> EchoStats:
        with self._lock:
            return EchoStats(num_waiting=len(self._inbox), num_running=len(self._running))
