"""Several hosts on one machine: three Linux network namespaces on a private bridge (tests/e2e/netns.py), each a
"machine" with its own 10.x address and a node of a three-node NATS cluster. Host a runs worker A, host b worker B,
host c the dispatcher and the gateway; the test process is the operator's machine on the bridge. Every byte between
them crosses a real interface: NATS routes, the services' NATS connections, the Mooncake fork and P/D KV transfers.

- a fork B <- A and a P/D hand-over A -> B across hosts, checked by checksum and by the tokens;
- host c's NATS node killed -9 under load: the gateway's and dispatcher's connection fails over, no stream is cut;
- host b's link cut under load: what the clients see (a clear error, within a bound) and the recovery.

Each process names its own host's NATS node only (`--nats nats://<its address>:4222`) and learns the other nodes
from the cluster (nats-server gossips its peers' client URLs): a client given several URLs picks one at random, and
the kill of c's node must be sure to drop the gateway's and dispatcher's connections. Figures: docs/operations.md
("Several machines") and docs/reliability.md.
"""
from __future__ import annotations

import asyncio
import hashlib
import os
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from contracts import (
    HealthReply,
    LifecycleAction,
    ModelState,
    RequestDone,
    RunAssignment,
    WorkerHeartbeat,
    subjects,
)
from runtime.bus import Bus, BusError
from runtime.client import Outcome, stream_completion, summarise
from runtime.nats_server import find_nats_server
from tests.bus.worker_procs import MODEL, Observer, command, read_replicas, whole_and_split

from . import netns
from .faults import LONG, report

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120, func_only=True)]

A, B = "mh-a", "mh-b"
INST_A, INST_B = f"{A}/{MODEL}", f"{B}/{MODEL}"
GATEWAY_PORT = 8000
SETUP_BOUND_S = 180.0  # three NATS nodes, two workers (torch, engines), a dispatcher and a gateway on a shared box
CUT_BOUND_S = 45.0  # every request in flight on the cut host ends (completed or a clear error) within this
# a client whose node's machine went silent (no reset: a cut link, a machine lost) fails over to another node
# within this: unanswered pings (runtime/bus.py PING_INTERVAL_S) take 4-6 s, then a connect attempt may go to the
# silent node first (5 s) before another; before the pings were set it stayed stuck for minutes
NATS_FAILOVER_BOUND_S = 20.0
LONG_TOKENS = 2000  # of 4096 positions: streams that outlast the fault (12 of them run 5-15 s here)


class Hosts:
    """The running set-up: the network, the NATS nodes, the services' processes, the operator's bus."""

    def __init__(self, net: netns.Network, nodes: list[netns.NatsNode], state: Path) -> None:
        self.net, self.nodes, self.state = net, nodes, state
        self.a, self.b, self.c = net.hosts
        self.bus: Bus | None = None
        self.obs = Observer()
        self.runs_on_b: list[RunAssignment] = []  # every RunAssignment sent to worker B, and when it arrived
        self.runs_on_b_at_s: list[float] = []

    @property
    def gateway_url(self) -> str:
        return f"http://{self.c.address}:{GATEWAY_PORT}"

    def node_of(self, host: netns.Host) -> netns.NatsNode:
        return next(n for n in self.nodes if n.host is host)

    def log_tail(self, name: str, num_chars: int = 3000) -> str:
        path = self.state / f"{name}.log"
        return path.read_text(errors="replace")[-num_chars:] if path.exists() else ""


def _serve(hosts: Hosts, host: netns.Host, service: str, instance: str, config: Path, *extra: str):
    janus = Path(sys.executable).parent / "janus"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "JANUS_LOG_LEVEL": "WARNING"}
    env.pop("JANUS_TRANSFER_HOST", None)  # each worker finds its own: the interface that reaches its NATS node
    # worker B joins as an operator on a second machine would (`janus join`), the rest run `janus serve`
    verb = ["join"] if instance == B else ["serve", service]
    return host.popen([str(janus), *verb, "--nats", hosts.node_of(host).url, "--config", str(config),
                       "--id", instance, "--state-dir", str(hosts.state), *extra],
                      log=hosts.state / f"{instance}.log", env=env)


async def _wait_healthy(hosts: Hosts, procs: dict, deadline_s: float) -> None:
    for (service, instance), proc in procs.items():
        while True:
            assert proc.poll() is None, f"{instance} exited:\n{hosts.log_tail(instance)}"
            try:
                await hosts.bus.request(subjects.health(service, instance), None, HealthReply, timeout_s=1)
                break
            except BusError:
                assert time.monotonic() < deadline_s, f"{instance} did not start:\n{hosts.log_tail(instance)}"
                await asyncio.sleep(0.2)
    async with httpx.AsyncClient(base_url=hosts.gateway_url, timeout=2.0) as client:
        while True:
            try:
                if (await client.get("/ready")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline_s, f"the gateway is not ready:\n{hosts.log_tail('gateway')}"
            await asyncio.sleep(0.2)


@pytest.fixture(scope="module")
async def hosts(tmp_path_factory, demo_models_dir):
    reason = netns.unavailable_reason()
    if reason:
        pytest.skip(reason)
    netns.sweep_leftovers()
    state = tmp_path_factory.mktemp("multi-host")
    net = netns.Network()
    hosts = None
    try:
        for name in ("a", "b", "c"):
            net.add_host(name)
        nodes = netns.nats_cluster(net.hosts, state, find_nats_server())
        hosts = Hosts(net, nodes, state)
        config = state / "cluster.yaml"
        config.write_text(yaml.safe_dump({
            "models": [{"name": MODEL, "path": str(demo_models_dir / MODEL), "ttft_slo_ms": 60_000,
                        "tpot_slo_ms": 1000}],
            "workers": {"pool_bytes": 96 << 20, "max_num_seqs": 8, "placement": {A: [MODEL], B: []}},
            "gateway": {"host": "0.0.0.0", "request_timeout_s": 90},
            "jetstream_replicas": 3,  # the registry survives any one node
        }))
        procs = {("worker", A): _serve(hosts, hosts.a, "worker", A, config),
                 ("worker", B): _serve(hosts, hosts.b, "worker", B, config),
                 ("dispatcher", "dispatcher"): _serve(hosts, hosts.c, "dispatcher", "dispatcher", config),
                 ("gateway", "gateway"): _serve(hosts, hosts.c, "gateway", "gateway", config,
                                                "--port", str(GATEWAY_PORT))}
        # the operator's bus names host a's node: a is never killed nor cut here
        hosts.bus = await Bus.connect(hosts.node_of(hosts.a).url, "multi-host-test")
        await hosts.obs.start(hosts.bus)

        async def on_run_b(run: RunAssignment, env) -> None:
            hosts.runs_on_b.append(run)
            hosts.runs_on_b_at_s.append(time.time())

        await hosts.bus.subscribe(subjects.worker_run(B), RunAssignment, on_run_b, traced=False)
        await _wait_healthy(hosts, procs, time.monotonic() + SETUP_BOUND_S)
        yield hosts
    finally:
        if hosts is not None and hosts.bus is not None:
            await hosts.bus.close()
        net.close()


async def _ensure_active(hosts: Hosts, worker: str, instance: str) -> None:
    reply = await command(hosts.bus, worker, instance, LifecycleAction.ACTIVATE)
    assert reply.ok and reply.state == ModelState.ACTIVE, reply


def test_the_transfer_host_is_the_interface_off_the_host_even_when_a_local_node_comes_first(hosts):
    """A host running a NATS node often lists it first (nats://127.0.0.1:4222,...): loopback reaches it, and a
    worker that advertised 127.0.0.1 could be forked from by nobody on another host. The first URL that leaves the
    host decides; loopback only when every URL is on this host."""
    probe = "import sys; from worker.dataplane.transfer import host_reaching; print(host_reaching(sys.argv[1]))"
    b_node = hosts.node_of(hosts.b).url
    local_first = f"nats://127.0.0.1:4222,{b_node}"
    assert hosts.a.run(sys.executable, "-c", probe, local_first).strip() == hosts.a.address
    assert hosts.a.run(sys.executable, "-c", probe, "nats://127.0.0.1:4222").strip() == "127.0.0.1"
    assert hosts.a.run(sys.executable, "-c", probe, f"nats://localhost:4222,{b_node}").strip() == hosts.a.address


def _segment_checksums(weights, segments) -> list[str]:
    from worker.lifecycle.checksums import segment_checksums

    return segment_checksums(weights, [s.num_bytes for s in segments], segments[0].checksum.partition(":")[0])


async def test_fork_and_pd_hand_over_cross_hosts_bit_identical(hosts):
    from worker.dataplane.transfer import transfer_settings

    bus, obs = hosts.bus, hosts.obs
    await _ensure_active(hosts, A, INST_A)
    hb_a = await obs.heartbeat_after(A, time.time() * 1e3)
    # each worker advertises its own host's address, found from the interface that reaches its NATS node
    assert hb_a.transfer_session.startswith(f"{hosts.a.address}:"), hb_a.transfer_session
    source = next(s for s in hb_a.instances if s.instance_id == INST_A)

    from contracts import ForkSource

    fork = ForkSource(worker_id=A, instance_id=INST_A, transfer_session=hb_a.transfer_session,
                      segments=source.weight_segments)
    started = time.perf_counter()
    reply = await command(bus, B, INST_B, LifecycleAction.FORK_FROM, fork_source=fork)
    fork_s = time.perf_counter() - started
    assert reply.ok and reply.state == ModelState.ACTIVE and "pulled" in reply.detail, reply
    num_weight_bytes = sum(s.num_bytes for s in source.weight_segments)
    print(f"\n[fork B <- A across hosts] {num_weight_bytes / 2**20:.1f} MiB of weights; pull "
          f"{reply.timings_ms['pull_ms']:.1f} ms ({num_weight_bytes / reply.timings_ms['pull_ms'] / 1e3:.0f} MB/s), "
          f"the whole command {fork_s * 1e3:.0f} ms; {reply.detail}")

    # read both replicas out of the two hosts from the operator's machine (a third address on the bridge) and
    # check every segment against the checksums A advertised
    hb_a = await obs.heartbeat_after(A, time.time() * 1e3)
    hb_b = await obs.heartbeat_after(B, time.time() * 1e3)
    assert hb_b.transfer_session.startswith(f"{hosts.b.address}:"), hb_b.transfer_session
    reader = transfer_settings(hosts.node_of(hosts.a).url)
    assert reader.host == hosts.net.gateway_address  # the root namespace's side of the bridge
    weights_a, weights_b = await read_replicas(reader, (hb_a, INST_A), (hb_b, INST_B))
    segments_b = next(i for i in hb_b.instances if i.instance_id == INST_B).weight_segments
    advertised = [s.checksum for s in source.weight_segments]
    assert _segment_checksums(weights_b, segments_b) == advertised == _segment_checksums(weights_a, segments_b)
    assert hashlib.sha256(weights_a.numpy()).hexdigest() == hashlib.sha256(weights_b.numpy()).hexdigest()

    # P/D: prefill on A, the KV written into B's blocks across the link, decode on B; the same tokens as one
    # instance doing it all (greedy), and the hand-over really happened (B ended it, A sent the notice)
    prompt = [(7 * i + 3) % 250 for i in range(200)]  # 13 KV blocks of 16 tokens
    num_runs = len(hosts.runs_on_b)
    (tokens_whole, _), (tokens_split, end_split), _, split = await whole_and_split(
        bus, obs, (A, INST_A), (B, INST_B), prompt, max_tokens=24)
    assert isinstance(end_split, RequestDone) and end_split.instance_id == INST_B, end_split
    assert tokens_split == tokens_whole and len(tokens_split) == 24
    assert any(p.request_id == split.request_id and p.handed_over_to_instance_id == INST_B for p in obs.prefills)
    handoff, arrived_s = next((r, t) for r, t in zip(hosts.runs_on_b[num_runs:], hosts.runs_on_b_at_s[num_runs:])
                              if r.request.request_id == split.request_id and r.kv_target is not None
                              and r.kv_target.block_offsets_bytes)
    kv_bytes = len(handoff.kv_target.block_offsets_bytes) * handoff.kv_target.block_num_bytes
    first_token_ms = next(p.first_token_unix_ms for p in obs.prefills if p.request_id == split.request_id and p.ok)
    print(f"[P/D A -> B across hosts] {len(prompt)} prompt tokens, {len(handoff.kv_target.block_offsets_bytes)} "
          f"KV blocks = {kv_bytes / 2**10:.0f} KiB written; first token to hand-over received "
          f"{arrived_s * 1e3 - first_token_ms:.1f} ms; tokens sha256 "
          f"{hashlib.sha256(str(tokens_split).encode()).hexdigest()[:12]} on both paths")


async def _load(url: str, num_requests: int, body: dict, *, timeout_s: float, stagger_s: float = 0.1,
                ended_s: list[float] | None = None) -> list[Outcome]:
    """Streamed completions through the gateway; `ended_s` gets each one's end (time.monotonic), in end order."""
    async with httpx.AsyncClient(base_url=url, timeout=None) as client:
        async def one(i: int) -> Outcome:
            await asyncio.sleep(i * stagger_s)
            outcome = await stream_completion(client, body, timeout_s=timeout_s)
            if ended_s is not None:
                ended_s.append(time.monotonic())
            return outcome

        return list(await asyncio.gather(*(one(i) for i in range(num_requests))))


async def _answers_again_s(bus: Bus, since_s: float, timeout_s: float) -> float:
    """Seconds from `since_s` until a request over `bus` (worker A's health) is answered again."""
    while True:
        try:
            await bus.request(subjects.health("worker", A), None, HealthReply, timeout_s=1)
            return time.monotonic() - since_s
        except BusError:
            assert time.monotonic() - since_s < timeout_s, f"a client of the cut node still stuck after {timeout_s} s"
            await asyncio.sleep(0.2)


async def _heartbeats_resume(hosts: Hosts, worker: str, since_unix_ms: float, timeout_s: float) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        hb: WorkerHeartbeat | None = hosts.obs.heartbeats.get(worker)
        if hb is not None and hb.sent_unix_ms > since_unix_ms:
            return time.time() - since_unix_ms / 1e3
        await asyncio.sleep(0.1)
    raise AssertionError(f"no heartbeat from {worker} within {timeout_s} s of the link coming back")


async def test_a_hosts_link_cut_under_load_gives_clear_errors_and_recovers(hosts):
    await _ensure_active(hosts, A, INST_A)
    await _ensure_active(hosts, B, INST_B)
    max_tokens = LONG_TOKENS
    num_runs = len(hosts.runs_on_b)
    ended_s: list[float] = []
    running = asyncio.create_task(_load(hosts.gateway_url, 12, {**LONG, "max_tokens": max_tokens},
                                        timeout_s=CUT_BOUND_S + 30, ended_s=ended_s))
    # a client of b's node from another machine (the operator's): the cut leaves its connection open and silent
    on_b = await Bus.connect(hosts.node_of(hosts.b).url, "multi-host-client-of-b")
    await asyncio.sleep(2.0)
    assert len(hosts.runs_on_b) > num_runs, "B was serving some of the load when its link went"
    cut_s = time.monotonic()
    hosts.b.cut()
    try:
        failed_over = asyncio.create_task(_answers_again_s(on_b, cut_s, timeout_s=NATS_FAILOVER_BOUND_S))
        # submitted while b is away: served by A
        during = summarise(await _load(hosts.gateway_url, 4, {**LONG, "max_tokens": 20}, timeout_s=60))
        outcomes = await running
        failover_s = await failed_over  # the link stays down until then: recovering by the link proves nothing
    finally:
        await on_b.close()
        hosts.b.restore()
    restored_unix_ms = time.time() * 1e3
    summary = report("host b's link cut under load", outcomes)
    failed = [o for o in outcomes if o.status == "failed"]
    after_cut_s = sorted(round(t - cut_s, 1) for t in ended_s)
    print(f"    the streams ended {after_cut_s} s after the cut; submitted during the cut: {during}; a client of "
          f"b's node answered again, through another node, {failover_s:.1f} s after the cut")
    assert summary["lost"] == 0, "no request hangs: each completes or ends with a clear error"
    assert max(after_cut_s) < CUT_BOUND_S
    assert failed, "the streams on B could not go on: they end with an error, not silence"
    assert all(o.code and o.message for o in failed), [(o.code, o.message) for o in failed]
    assert all(o.num_tokens == max_tokens for o in outcomes if o.status == "completed")
    assert during["completed"] == during["sent"], during
    # recovery: B's heartbeats are heard again, and the dispatcher sends B work that completes
    back_s = await _heartbeats_resume(hosts, B, restored_unix_ms, timeout_s=30)
    num_runs = len(hosts.runs_on_b)
    deadline = time.monotonic() + 45
    while True:
        after = summarise(await _load(hosts.gateway_url, 8, {**LONG, "max_tokens": 20}, timeout_s=60,
                                      stagger_s=0.0))
        assert after["completed"] == after["sent"], after
        if len(hosts.runs_on_b) > num_runs or time.monotonic() > deadline:
            break
    print(f"    link back: B heard again after {back_s:.1f} s; B routed to again: {len(hosts.runs_on_b) > num_runs}")
    assert len(hosts.runs_on_b) > num_runs, "B serves again once its link is back"


async def test_killing_the_third_hosts_nats_node_under_load_cuts_no_stream(hosts):
    await _ensure_active(hosts, A, INST_A)
    await _ensure_active(hosts, B, INST_B)
    node_c = hosts.node_of(hosts.c)
    on_c = node_c.client_names()
    # the kill drops the gateway's and the dispatcher's connections (client names: janus-<service>-<id>)
    assert all(any(n.startswith(f"janus-{s}") for n in on_c) for s in ("gateway", "dispatcher")), on_c
    running = asyncio.create_task(_load(hosts.gateway_url, 12, {**LONG, "max_tokens": LONG_TOKENS}, timeout_s=90))
    await asyncio.sleep(2.0)
    killed_s = time.monotonic()
    node_c.kill9()
    outcomes = await running
    streamed_past_kill_s = time.monotonic() - killed_s
    summary = report(f"host c's NATS node killed -9 (clients on it: {', '.join(on_c)})", outcomes)
    print(f"    the streams ran {streamed_past_kill_s:.1f} s past the kill")
    assert summary["lost"] == 0 and summary["completed"] == summary["sent"], summary
    assert all(o.num_tokens == LONG_TOKENS for o in outcomes)
    assert streamed_past_kill_s > 2.0, "the streams were running when the node died"

    after = summarise(await _load(hosts.gateway_url, 4, {**LONG, "max_tokens": 20}, timeout_s=60))
    assert after["completed"] == 4, after
    # back as it was for the next test: c's node again, the cluster whole
    node_c.start(find_nats_server())
    netns.wait_routed(hosts.nodes, timeout_s=30)
