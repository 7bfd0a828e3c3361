"""Prefix-aware routing through the whole path (docs/dispatcher.md, "Prefix affinity"): two workers serve the same
model with real engines; concurrent multi-turn chats, each turn resending the previous prompt, go through the
gateway with the official openai SDK. Every later turn must land on the instance holding its prefix: the usage's
`prompt_tokens_details.cached_tokens` (the engine's own count, RequestDone) shows the previous prompt found cached.
Without the dispatcher's affinity a turn goes to whichever instance is freest, and its prompt is computed whole.

The first turns go out together and are answered before the later turns go out, also together. A turn that met its
holder busy computing another chat's whole first prompt faced a near tie (wait for the holder, or compute the prompt
whole on the free instance), which the dispatcher settles by its predictions either way: on two busy cores about
half the runs sent such a turn elsewhere. The decode gap is raised (docs/dispatcher.md, "Prefix affinity"): four
chats of two-token answers are no pile of decodes, yet heartbeat figures half a second old can count a holder of
three chats as six sequences busy, and the gap would then send a turn away from its prefix."""
from __future__ import annotations

import asyncio
import random

import openai
import pytest

from tests.bus.cluster import start_cluster

MODEL = "demo-small"
NUM_CHATS, NUM_TURNS = 4, 4
SYSTEM_TOKENS, TURN_TOKENS = 160, 24


@pytest.fixture(scope="module")
async def cluster(nats_url, demo_models_dir):
    config = {"models": [{"name": MODEL, "path": str(demo_models_dir / MODEL), "ttft_slo_ms": 60_000}],
              "dispatcher": {"prefix_max_decode_gap": 64}}
    c = await start_cluster(nats_url, config, demo_models_dir, num_workers=2, tag="pfx")
    yield c
    await c.stop()


async def test_each_turn_of_a_chat_finds_its_previous_prompt_cached_on_the_instance_it_lands_on(cluster):
    client = openai.AsyncOpenAI(base_url=f"{cluster.url}/v1", api_key="unused", timeout=120, max_retries=0)
    rng = random.Random(7)
    assigned: list[tuple[str, str]] = []  # (request id, instance): what the dispatcher decided
    core = cluster.dispatcher.core
    assign = core._assign

    def spy(now, job, record, predicted_ms):
        assigned.append((job.request.request_id, record.instance_id))
        return assign(now, job, record, predicted_ms)

    core._assign = spy
    try:
        async def turn(prompt: list[int]) -> tuple[int, int]:
            done = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
            return len(prompt), done.usage.prompt_tokens_details.cached_tokens

        async def later_turns(prompt: list[int]) -> list[tuple[int, int]]:
            seen = []
            for _ in range(NUM_TURNS - 1):
                prompt = prompt + [rng.randrange(100, 2000) for _ in range(TURN_TOKENS)]
                seen.append(await turn(prompt))
            return seen

        prompts = [[rng.randrange(100, 2000) for _ in range(SYSTEM_TOKENS)] for _ in range(NUM_CHATS)]
        firsts = await asyncio.gather(*(turn(p) for p in prompts))
        laters = await asyncio.gather(*(later_turns(p) for p in prompts))
        turns = [[first] + later for first, later in zip(firsts, laters)]
    finally:
        core._assign = assign
    for seen in turns:
        for (prev_len, _), (length, cached) in zip(seen, seen[1:]):
            # the previous prompt's whole blocks (16 tokens each) are found; the new tokens are computed
            assert prev_len - 16 <= cached < length, (seen, assigned)
    instances = {instance for _, instance in assigned}
    print(f"\n{len(assigned)} turns on {len(instances)} instances; cached tokens per chat: "
          f"{[[c for _, c in seen] for seen in turns]}")
