"""When was each peer last heard, not counting the time this process could not listen.

A process whose event loop stalls (a long model load, a garbage collection, a loaded host) cannot read the
heartbeats waiting in its socket; when it wakes, its watchdog may run before those heartbeats are read and declare
every peer dead. So a watchdog tick that comes much later than planned shifts every peer's last-heard time forward
by the lateness: the stall is this process's silence, not the peers'.
"""
from __future__ import annotations


class PeerLiveness:
    def __init__(self, *, timeout_s: float, check_period_s: float) -> None:
        self.timeout_s = timeout_s
        self.check_period_s = check_period_s
        self._heard_s: dict[str, float] = {}
        self._last_check_s: float | None = None

    def heard(self, peer: str, now_s: float) -> None:
        self._heard_s[peer] = now_s

    def know(self, peer: str, now_s: float) -> None:
        """Start the clock for a peer met indirectly (a registry record) unless it was heard already."""
        self._heard_s.setdefault(peer, now_s)

    def forget(self, peer: str) -> None:
        self._heard_s.pop(peer, None)

    def last_heard_s(self, peer: str) -> float | None:
        return self._heard_s.get(peer)

    def least_silent_s(self, now_s: float) -> float | None:
        """Since the most recently heard peer was heard (None: none ever): "is anyone there?" for readiness."""
        return None if not self._heard_s else now_s - max(self._heard_s.values())

    def silent_for_s(self, peer: str, now_s: float) -> float | None:
        heard = self._heard_s.get(peer)
        return None if heard is None else now_s - heard

    def check(self, now_s: float, *, is_listening: bool = True) -> dict[str, float]:
        """Peers silent past the timeout, with how long; call once per watchdog tick. `is_listening=False` (this
        process has no NATS connection: its node died, it is reconnecting) stops every peer's clock since the last
        tick and reports nobody: that silence is ours too."""
        if not is_listening:
            if self._last_check_s is not None:
                for peer in self._heard_s:
                    self._heard_s[peer] = min(now_s, self._heard_s[peer] + max(0.0, now_s - self._last_check_s))
            self._last_check_s = now_s
            return {}
        if self._last_check_s is not None:
            # a tick is late by more than its period when the loop was blocked: discount that time
            stall_s = now_s - self._last_check_s - 2 * self.check_period_s
            if stall_s > 0:
                for peer in self._heard_s:
                    self._heard_s[peer] = min(now_s, self._heard_s[peer] + stall_s)
        self._last_check_s = now_s
        return {peer: now_s - heard for peer, heard in self._heard_s.items() if now_s - heard >= self.timeout_s}
