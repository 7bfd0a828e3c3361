"""What the tests of requests moving between engines share (P/D hand-over, moving a running decode)."""
from __future__ import annotations

from contracts.requests import SamplingParams

PROMPT = [(i * 37 + 11) % 1000 + 3 for i in range(21)]


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, **kw)


def run_to_end(engine) -> list:
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    return outs
