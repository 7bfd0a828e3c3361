"""Read a Prometheus text exposition the way Prometheus does (its own parser), for tests that scrape /metrics."""
from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


def samples(text: str, name: str, **labels: str) -> list[float]:
    """Values of the samples called `name` whose labels include `labels`."""
    return [s.value for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]


async def scrape(url: str) -> str:
    async with httpx.AsyncClient() as client:
        r = await client.get(url)
    r.raise_for_status()
    return r.text
