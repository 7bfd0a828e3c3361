"""From the requests' event streams to the HTTP answer: one JSON body, or server-sent events.

A completions batch is several requests (one per prompt); their streams are merged as events arrive and each
event lands on its choice (responses.py says how choices are indexed).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass
from typing import AsyncIterator, Callable

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from contracts import ErrorCode, GenerateRequest, RequestDone, RequestFailed, TokenChunk

from .core.errors import ApiError, error_body
from .core.responses import Choice, Completion, apply_chunk, apply_done, chunk_body, final_body, logprobs_body
from .core.responses import token_entries, usage_chunk
from .core.tools import ToolPlan, held_back, parse_calls
from .metrics import InterTokenClock

Event = TokenChunk | RequestDone | RequestFailed
TokenPieces = Callable[[int], tuple[str, bytes]]  # a token id -> its text and bytes (logprobs name each token)
Indexed = tuple[int, Event]  # (the request's place in the batch, its event)


@dataclass(frozen=True)
class Shape:
    """What the client asked the answer to look like."""

    kind: str  # "completion" | "chat"
    stream: bool
    include_usage: str | None  # None, "final" or "continuous"
    n: int = 1
    pieces: TokenPieces | None = None  # set when the request asked for logprobs
    with_top: bool = False  # completions: the legacy top_logprobs dicts
    prefixes: tuple[str, ...] | None = None  # echo: each prompt's text
    tools: ToolPlan | None = None  # chat with tools: calls are parsed out of the output (core/tools.py)

    @property
    def parses_calls(self) -> bool:
        return self.kind == "chat" and self.tools is not None and self.tools.mode != "none"


def _sse(obj: dict | str) -> bytes:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, separators=(',', ':'))}\n\n".encode()


def new_completion(requests: list[GenerateRequest], kind: str, shape: Shape) -> Completion:
    n = shape.n
    choices = [Choice(p * n + j, prefix=shape.prefixes[p] if shape.prefixes else "")
               for p in range(len(requests)) for j in range(n)]
    return Completion(request_id=requests[0].request_id, model=requests[0].model, created_s=int(time.time()),
                      kind=kind, num_prompt_tokens=sum(r.num_prompt_tokens for r in requests), choices=choices)


async def merged(streams: list[AsyncIterator[Event]]) -> AsyncIterator[Indexed]:
    """Every stream's events as they come, tagged with the stream's place. Closing this closes them all (which
    cancels their work)."""
    if len(streams) == 1:
        try:
            async for ev in streams[0]:
                yield 0, ev
        finally:
            await streams[0].aclose()
        return
    queue: asyncio.Queue = asyncio.Queue()
    end = object()

    async def pump(p: int, stream: AsyncIterator[Event]) -> None:
        try:
            async for ev in stream:
                await queue.put((p, ev))
        finally:
            await queue.put((p, end))

    tasks = [asyncio.ensure_future(pump(p, s)) for p, s in enumerate(streams)]
    try:
        num_open = len(streams)
        while num_open:
            p, ev = await queue.get()
            if ev is end:
                num_open -= 1
                continue
            yield p, ev
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for s in streams:
            with contextlib.suppress(Exception):
                await s.aclose()


async def respond(request: Request, requests: list[GenerateRequest], submit, shape: Shape, on_end_owner: list):
    """`submit`: GenerateRequest -> its event stream. A stream takes the last of `on_end_owner` (the tenant's slot
    release) and runs it when the stream ends."""
    completion = new_completion(requests, shape.kind, shape)
    events = merged([submit(r) for r in requests])
    if shape.stream:
        first = await _first_event(events)  # errors before the first token become a plain HTTP error
        clock = InterTokenClock([(r.model, r.tenant) for r in requests])
        clock.see(*first, time.monotonic())
        on_end = on_end_owner.pop()
        return StreamingResponse(_stream(first, events, completion, shape, on_end, clock),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    collect = asyncio.ensure_future(_collect(events, completion, shape.n))
    watch = asyncio.ensure_future(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({collect, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if collect not in done:
        collect.cancel()  # the client left: closing the event stream cancels the work
        return JSONResponse(error_body(ErrorCode.CANCELLED, "client disconnected"), 499)
    collect.result()
    logprobs = None
    if shape.pieces is not None:
        logprobs = {c.index: logprobs_body(shape.kind, _entries(shape.pieces, c), text_offset=len(c.prefix),
                                           with_top=shape.with_top) for c in completion.choices}
    body = final_body(completion, logprobs)
    if shape.parses_calls:
        assert shape.tools is not None
        for choice in body["choices"]:
            content, calls = parse_calls(choice["message"]["content"], shape.tools)
            if calls:
                choice["message"] = {"role": "assistant", "content": content, "tool_calls": calls}
                choice["finish_reason"] = _calls_finish(choice["finish_reason"])
    return JSONResponse(body)


def _calls_finish(finish_reason: str | None) -> str | None:
    return "tool_calls" if finish_reason == "stop" else finish_reason


def _entries(pieces: TokenPieces, choice: Choice, start: int = 0, stop: int | None = None) -> list:
    return token_entries(pieces, choice.token_ids[start:stop], choice.logprobs[start:stop],
                         choice.top_logprobs[start:stop])


async def _wait_disconnect(request: Request) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(0.25)


async def _first_event(events: AsyncIterator[Indexed]) -> Indexed:
    p, ev = await events.__anext__()
    if isinstance(ev, RequestFailed):
        await events.aclose()
        raise ApiError.from_info(ev.error)
    return p, ev


async def _collect(events: AsyncIterator[Indexed], completion: Completion, n: int) -> None:
    try:
        async for p, ev in events:
            if isinstance(ev, TokenChunk):
                apply_chunk(completion, p * n, n, ev)
            elif isinstance(ev, RequestDone):
                apply_done(completion, p * n, n, ev.finish_reason, ev.num_cached_tokens)
                if completion.is_done:
                    return
            else:
                raise ApiError.from_info(ev.error)
    finally:
        await events.aclose()


async def _stream(first: Indexed, events: AsyncIterator[Indexed], completion: Completion, shape: Shape,
                  on_end, clock: InterTokenClock) -> AsyncIterator[bytes]:
    n, kind = shape.n, shape.kind
    # a token that ends inside a multi-byte character has no text yet: its chunk is held back, and its logprob
    # rides on the next chunk of its choice (clients count tokens by logprobs; none may be lost)
    held_from: dict[int, int] = {}  # choice index -> first token whose logprob has not gone out

    async def chain() -> AsyncIterator[Indexed]:
        yield first
        async for p, ev in events:
            clock.see(p, ev, time.monotonic())  # as the response takes it: the gaps its client sees
            yield p, ev

    def with_usage(chunk: dict) -> dict:
        return {**chunk, "usage": completion.usage()} if shape.include_usage == "continuous" else chunk

    def take_logprobs(choice: Choice, text_offset: int) -> dict | None:
        if shape.pieces is None:
            return None
        start = held_from.get(choice.index, 0)
        held_from[choice.index] = len(choice.token_ids)
        entries = _entries(shape.pieces, choice, start)
        return logprobs_body(kind, entries, text_offset=text_offset, with_top=shape.with_top) if entries else None

    def chunk(choice: Choice, text: str, finish_reason: str | None, is_first: bool) -> bytes:
        offset = len(choice.text) - len(text)
        return _sse(with_usage(chunk_body(completion, text, finish_reason, index=choice.index, is_first=is_first,
                                          logprobs=take_logprobs(choice, offset))))

    sent_chars: dict[int, int] = {}  # tools: choice index -> characters of its output sent as content

    def tool_chunks(choice: Choice, finish_reason: str | None, is_first: bool) -> list[bytes]:
        """Content as far as no call can start in it; at the end, the rest, then the calls as tool_calls deltas."""
        assert shape.tools is not None
        full, sent = "".join(choice.text_parts), sent_chars.get(choice.index, 0)
        choice.has_started = True
        if finish_reason is None:
            upto = max(sent, held_back(full, shape.tools))
            sent_chars[choice.index] = upto
            return [chunk(choice, full[sent:upto], None, is_first)] if upto > sent or is_first else []
        content, calls = parse_calls(full, shape.tools)
        tail = (content or "")[sent:] if calls else full[sent:]
        out = [chunk(choice, tail, None, is_first)] if tail or is_first else []
        if calls:
            body = chunk_body(completion, "", None, index=choice.index)
            body["choices"][0]["delta"] = {"tool_calls": [{"index": i, **call} for i, call in enumerate(calls)]}
            out.append(_sse(with_usage(body)))
            finish_reason = _calls_finish(finish_reason)
        return out + [chunk(choice, "", finish_reason, False)]

    try:
        async for p, ev in chain():
            if isinstance(ev, TokenChunk):
                choice = apply_chunk(completion, p * n, n, ev)
                if choice is None:
                    continue
                if shape.parses_calls:
                    for data in tool_chunks(choice, ev.finish_reason, not choice.has_started):
                        yield data
                    continue
                is_first = not choice.has_started
                text = (choice.prefix + ev.text) if is_first else ev.text
                if text or is_first or ev.finish_reason:
                    choice.has_started = True
                    yield chunk(choice, text, ev.finish_reason, is_first)
            elif isinstance(ev, RequestDone):
                for choice in apply_done(completion, p * n, n, ev.finish_reason, ev.num_cached_tokens):
                    if shape.parses_calls:
                        for data in tool_chunks(choice, ev.finish_reason, not choice.has_started):
                            yield data
                        continue
                    is_first = not choice.has_started
                    choice.has_started = True
                    yield chunk(choice, choice.prefix if is_first else "", ev.finish_reason, is_first)
                if completion.is_done:
                    if shape.include_usage:
                        yield _sse(usage_chunk(completion))
                    yield _sse("[DONE]")
                    return
            else:
                yield _sse(ApiError.from_info(ev.error).body())
                yield _sse("[DONE]")
                return
    finally:
        on_end()
        await events.aclose()  # a disconnected client cancels its work
