"""A streaming client that records what each request ended as: what load tests, fault tests and trace replay use.

Every request ends as exactly one of: completed (a finish reason and [DONE]), failed (an HTTP error or an error
event, with its code), or lost (the stream broke off or nothing terminal came before the client's timeout). A
serving platform worth the name keeps `lost` at zero.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx


@dataclass
class Outcome:
    status: str  # completed | failed | lost
    code: str = ""
    message: str = ""
    num_tokens: int = 0
    ttft_s: float | None = None
    latency_s: float = 0.0
    token_times_s: list[float] = field(default_factory=list)


async def stream_completion(client: httpx.AsyncClient, body: dict, *, timeout_s: float = 120.0,
                            headers: dict | None = None) -> Outcome:
    """POST a streamed completion (chat if the body has messages) and classify how it ended."""
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    out = Outcome(status="lost")
    try:
        async with asyncio.timeout(timeout_s):
            async with client.stream("POST", path, json=body, headers=headers) as r:
                if r.status_code != 200:
                    data = json.loads(await r.aread() or b"{}")
                    err = data.get("error", {})
                    return Outcome("failed", err.get("code", str(r.status_code)), err.get("message", ""),
                                   latency_s=time.perf_counter() - start)
                finished = False
                async with contextlib.aclosing(r.aiter_lines()) as stream_lines:  # closed here, not by the collector
                    async for line in stream_lines:
                        if not line.startswith("data: "):
                            continue
                        payload = line[6:]
                        if payload == "[DONE]":
                            out.status = "completed" if finished else out.status
                            break
                        event = json.loads(payload)
                        if "error" in event:
                            out.status, out.code = "failed", event["error"].get("code", "")
                            out.message = event["error"].get("message", "")
                            continue
                        if event.get("usage"):
                            out.num_tokens = event["usage"]["completion_tokens"]
                        for choice in event.get("choices", []):
                            piece = choice.get("text") if "text" in choice else choice.get("delta", {}).get("content")
                            if piece:
                                now = time.perf_counter() - start
                                out.token_times_s.append(now)
                                if out.ttft_s is None:
                                    out.ttft_s = now
                            if choice.get("finish_reason"):
                                finished = True
    except (httpx.HTTPError, asyncio.TimeoutError, json.JSONDecodeError) as exc:
        out.status, out.message = ("lost", repr(exc)) if out.status != "failed" else (out.status, out.message)
    out.latency_s = time.perf_counter() - start
    return out


def summarise(outcomes: list[Outcome]) -> dict:
    counts = Counter(o.status for o in outcomes)
    return {"sent": len(outcomes), "completed": counts["completed"], "failed": counts["failed"],
            "lost": counts["lost"], "failure_codes": dict(Counter(o.code for o in outcomes if o.status == "failed"))}
