"""How often a supervised process may be restarted: a token bucket that refills with the time the process ran.

Pure: time is passed in (seconds, any monotonic clock). The launcher (ops/launcher.py) keeps one budget per child
and per nats-server node.

- Each restart spends one token. With no token left the supervisor gives up on the process (a crash loop).
- Tokens come back with the time the process *ran* before it exited (`refill_period_s` of uptime per token, at most
  `max_num_restarts`): a child killed now and then, after running a while each time, keeps being restarted forever,
  while one that dies right after every start spends its budget in a handful of tries. Wall time alone would not
  separate the two: a crash loop slowed by back-off would earn its tokens back while it waits.
- The delay before a restart doubles with each exit that came soon after a start (`stable_after_s`), from
  `first_backoff_s` to `max_backoff_s`; an exit after a stable run is restarted after `first_backoff_s`.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RestartPolicy:
    max_num_restarts: int = 5  # the bucket's size: restarts allowed in a burst
    # uptime that earns one restart back: a child killed 5 s or more after each start is kept up (each run earns back
    # the restart it needs); one that dies within 2 s of every start (a crash loop) is given up on after 7 restarts
    refill_period_s: float = 5.0
    stable_after_s: float = 5.0  # an exit after this much uptime resets the back-off
    first_backoff_s: float = 0.25
    max_backoff_s: float = 8.0


@dataclass(frozen=True)
class RestartDecision:
    restart: bool  # False: give up (the budget is spent)
    delay_s: float  # wait this long after the exit before starting again
    tokens_left: float  # after this restart, for the log line
    reason: str


class RestartBudget:
    def __init__(self, policy: RestartPolicy = RestartPolicy()) -> None:
        self.policy = policy
        self.tokens = float(policy.max_num_restarts)
        self.num_quick_exits = 0  # exits in a row that came before `stable_after_s` of uptime
        self.num_restarts = 0
        self.gave_up = False

    def on_exit(self, uptime_s: float) -> RestartDecision:
        """The process exited after running `uptime_s`: restart it (after a delay) or give up."""
        p = self.policy
        self.tokens = min(float(p.max_num_restarts), self.tokens + max(0.0, uptime_s) / p.refill_period_s)
        if uptime_s >= p.stable_after_s:
            self.num_quick_exits = 0
        if self.gave_up or self.tokens < 1.0:
            self.gave_up = True
            return RestartDecision(False, 0.0, self.tokens,
                                   f"{self.num_restarts} restarts, the last ones within {uptime_s:.1f} s of their "
                                   f"start: out of restart budget ({p.max_num_restarts}, one back per "
                                   f"{p.refill_period_s:g} s of uptime)")
        delay_s = min(p.max_backoff_s, p.first_backoff_s * 2 ** self.num_quick_exits)
        self.num_quick_exits += 1
        self.tokens -= 1.0
        self.num_restarts += 1
        return RestartDecision(True, delay_s, self.tokens, f"ran {uptime_s:.1f} s")
