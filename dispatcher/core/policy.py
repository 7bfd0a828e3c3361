"""The dispatcher's knobs: one frozen model with the paper's defaults (docs/dispatcher.md, "Knobs")."""
from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class Algorithm(StrEnum):
    """How a prefill instance is chosen. LST-IMH is the paper's; the other two are its baselines."""

    LST_IMH = "lst_imh"
    ROUND_ROBIN = "round_robin"
    LEAST_LOAD = "least_load"


class OverloadPolicy(StrEnum):
    """What LST-IMH does with a request no ready instance can finish before its deadline."""

    REJECT = "reject"  # fail it at once with ErrorCode.OVERLOADED
    REQUEUE = "requeue"  # keep it with a relaxed deadline; it is late and never counts as on time


class DispatchPolicy(BaseModel):
    """Dispatcher knobs. Defaults follow the paper where it gives one; where the simulator measured a better value on
    the headline scenario it is the default, live and simulated alike (docs/sim.md, "One control plane")."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    algorithm: Algorithm = Algorithm.LST_IMH
    # Requeue: a request no ready instance can finish in time is served late rather than refused at once (its later
    # tokens can still meet their deadlines), for a bounded wait: max_num_relaxations TTFT SLOs past its deadline,
    # then it fails with OVERLOADED (503 with Retry-After at the gateway). Reject refused 7-16 % of aiperf's
    # requests at concurrency 12-16 on two CPU workers, each of which a moment's wait would have served.
    overload: OverloadPolicy = OverloadPolicy.REQUEUE
    lookahead_ms: float = Field(
        default=20.0,
        ge=0,
        description="an instance whose EPDT is within this of now gets its planned requests; later ones keep "
        "theirs in the global queue (late binding) and a round runs again this long before they free up",
    )
    is_late_binding: bool = Field(
        default=True,
        description="commit planned work only to instances within lookahead_ms of free (False: every instance's "
        "whole plan is committed at once, the literal reading; kept for the ablation in docs/dispatcher.md)",
    )
    defers_rounds_until_near: bool = Field(
        default=True,
        description="requeue with late binding: run a round only when an instance is within lookahead_ms of free or "
        "a late request turns hopeless (docs/dispatcher.md); before that nothing could be committed, and the arrivals "
        "in "
        "between are planned together. Under reject every event still runs a round, so a rejection comes at once. "
        "False: a round on every event",
    )
    max_wait_for_instance_ms: float = Field(
        default=30_000.0,
        ge=0,
        description="a request for a model with no ready instance waits in the queue up to this long for one to "
        "come up (one starting, one the scaler starts on seeing the load, or a worker heard from again after a bus "
        "failover), then fails with NO_INSTANCE; 0: fails at once. 30 s covers a cold load from disk: served late "
        "beats not served",
    )
    deadline_margin_frac: float = Field(
        default=0.05,
        ge=0,
        lt=1,
        description="plans aim this share of the TTFT SLO before each deadline: slack for prefill-time prediction "
        "error (0 plans to the edge; see docs/dispatcher.md for the measured effect)",
    )
    is_work_conserving: bool = Field(
        default=True,
        description="a near-free instance LST-IMH left empty takes the most urgent request planned on a later "
        "instance instead of idling; late requests only fill such idle instances",
    )
    relaxation_factor: float = Field(
        default=1.0,
        gt=0,
        description="requeue: each relaxation moves the deadline out by this many TTFT SLOs (d - a)",
    )
    max_num_relaxations: int = Field(
        default=2, ge=1, description="requeue: after this many relaxations a still-infeasible request is rejected "
        "(one whose prefill alone is longer than the whole wait is served late instead: docs/dispatcher.md)",
    )
    max_num_attempts: int = Field(
        default=3,
        ge=1,
        description="dispatches of one request; an instance that dies (or fails a prefill) before the first token "
        "costs one",
    )
    confirm_assignment_after_ms: float = Field(
        default=5_000.0,
        gt=0,
        description="an assignment with no PrefillDone this long is checked with its worker (janus.worker.<w>.holds): "
        "one a bus failover dropped, or whose hand-back it dropped, goes back to the queue, rather than waiting out "
        "the gateway's request timeout. Longer than a queued request's usual wait at its instance (LST-IMH sends "
        "work to instances about to be free), so a healthy cluster is rarely asked",
    )
    is_prefix_affine: bool = Field(
        default=True,
        description="LST-IMH predicts a request's prefill on an instance from the prompt tokens that instance would "
        "not find in its prefix cache, as far as the dispatcher knows from what it routed there, and among equally "
        "free instances prefers the ones holding the queue's prefixes (dispatcher/core/prefix_affinity.py); deadlines "
        "decide first. Requests without token ids (the simulator's) are routed as without it",
    )
    prefix_max_decode_gap: int = Field(
        default=4,
        ge=0,
        description="a co-located instance holding a prefix is favoured only while its decode backlog stays within "
        "this many sequences of the least busy instance's: a prefix every request shares (a system prompt) would "
        "otherwise pile the model's decoding on its first holder",
    )
    prefix_block_size: int = Field(
        default=16, ge=1, description="tokens per KV block of the engines' prefix cache (EngineConfig.block_size)"
    )
    prefix_blocks_per_instance: int = Field(
        default=8192,
        ge=1,
        description="blocks remembered per instance, least recently routed dropped first: about the KV an instance "
        "keeps (8192 x 16 = 131k tokens); more promises hits its engine has evicted",
    )
    window_s: float = Field(default=5.0, gt=0, description="length of the sliding load window the planners read: "
                            "2 s of a bursty model is mostly noise (docs/sim.md)")
    publish_period_ms: float = Field(default=500.0, gt=0, description="how often a load window is published")
    # A model woken from zero waited up to a publish period for its window, then up to a scaler period for a plan,
    # before its first instance started loading. Off by default with the scaler's `is_woken_at_once`, which needs
    # it (docs/planner.md, "Waking a model at once"; docs/bench/sim.md run 55).
    is_wake_published_at_once: bool = Field(
        default=False, description="the first request of a model with no ready instance publishes the model's load "
        "window at once, not at the next publish period: the elastic scaler starts its first instance on it "
        "(ElasticScaler.wake)"
    )
    # Moving decodes off draining decode instances (moves.py; the workers carry the moves out: worker/dataplane/
    # move_flow.py). Off by default: 7-8 % fewer device-hours for the clairvoyant Janus, but the learned one met its
    # goals less often over six runs (docs/bench/sim.md, run 56).
    moves_draining_decodes: bool = Field(
        default=False, description="a decode instance draining for move_after_draining_ms moves its running "
        "decodes to active instances of its model with room, so that its devices free before its longest "
        "sequence ends"
    )
    move_after_draining_ms: float = Field(
        default=30_000.0, ge=0, description="how long a decode instance drains before its decodes move: a drain "
        "the scaler takes back within this (DRAINING -> ACTIVE) keeps its sequences where they are"
    )
    move_tpot_margin_frac: float = Field(
        default=0.6, gt=0, le=1, description="a target takes moved decodes while its step, grown in proportion to "
        "its batch, stays within this share of the model's TPOT SLO"
    )
    move_max_per_target: int = Field(
        default=8, ge=1, description="moves one target takes between two of its heartbeats (and what an idle "
        "target, whose step is unknown, takes)"
    )
