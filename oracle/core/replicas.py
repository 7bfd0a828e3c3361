"""How many replicas serve each model, and since when: what the oracle needs to tell a window that measured a
replica count from one that straddled a change of it."""
from __future__ import annotations


class ReplicaCounts:
    """Per model, the count of serving replicas last reported and the time (ms) it has held since. A model never
    reported has no count; one that stopped being served has 0 (and its own `since`)."""

    def __init__(self) -> None:
        self._count: dict[str, int] = {}
        self._since_ms: dict[str, float] = {}

    def update(self, model: str, count: int, now_ms: float) -> None:
        if self._count.get(model) != count:
            self._count[model] = count
            self._since_ms[model] = now_ms

    def count(self, model: str) -> int:
        return self._count.get(model, 0)

    def since_ms(self, model: str) -> float | None:
        """When the model's current count began (None: never reported)."""
        return self._since_ms.get(model)

    def models(self) -> list[str]:
        return list(self._count)
