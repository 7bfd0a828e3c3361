"""The real oracle service over a real nats-server reports itself: it loads the training set `janus profile` leaves
at `<state_dir>/oracle/<model>.json`, fits its GPs in the background, scores the dispatchers' load windows against
its predictions (replicas counted from heartbeats) and says all of it on /metrics and in its health detail."""
from __future__ import annotations

import asyncio
import time

from contracts import (DeviceInfo, InstanceRole, InstanceStatus, ModelLoadWindow, ModelState, PageCounters, Pool,
                       WorkerHeartbeat, subjects)
from oracle.profile.grid import GridPoint, LengthMix, load_grid
from oracle.profile.synthetic import roofline_training_set
from oracle.roofline import RooflineModel
from oracle.specs import h200, model_shape
from oracle.training_files import save_training_set
from runtime.service import run_service
from runtime.settings import ClusterConfig, JanusSettings
from tests.polling import wait_for
from tests.scrape import samples, scrape

MODEL, COLD = "om-tiny", "om-cold"  # names of this test's own (the metrics registry is the process's)
CHAT = LengthMix("chat", 256, 1.0, 64)
SLO = {"ttft_slo_ms": 300.0, "tpot_slo_ms": 20.0}
NUM_WINDOWS = 6


def heartbeat(worker_id: str, model: str, num_active: int) -> WorkerHeartbeat:
    return WorkerHeartbeat(
        worker_id=worker_id, seq=1, sent_unix_ms=time.time() * 1e3,
        device=DeviceInfo(kind="cpu", name="cpu", hbm_bytes=1 << 30),
        pages=PageCounters(page_size_bytes=2 << 20, num_pages_total=10, num_pages_free=10, fragmentation=0.0),
        instances=tuple(InstanceStatus(instance_id=f"{worker_id}-{i}", model=model, role=InstanceRole.COLOCATED,
                                       pool=Pool.ELASTIC, state=ModelState.ACTIVE) for i in range(num_active)))


async def test_oracle_metrics_show_its_gps_and_its_error_on_windows(nats_url, bus_factory, demo_models_dir,
                                                                    tmp_path):
    from oracle.service import OracleService

    # the training set `janus profile --model om-tiny` would leave (here: the synthetic generator), and a broken one
    (tmp_path / "oracle").mkdir()
    roofline = RooflineModel(h200(), model_shape("qwen2-0.5b"))
    grid = load_grid([5, 10, 20, 40, 80, 160, 320, 640, 1280, 2560], [CHAT], [1, 2])  # 20 >= refit_min_new_samples
    save_training_set(roofline_training_set(MODEL, roofline, grid, attainment_noise=0.02, seed=2, **SLO), tmp_path / "oracle" / f"{MODEL}.json")
    (tmp_path / "oracle" / f"{COLD}.json").write_text("{truncated")

    tiny = str(demo_models_dir / "demo-tiny")
    cluster = ClusterConfig.model_validate({
        "models": [{"name": MODEL, "path": tiny, **SLO}, {"name": COLD, "path": tiny, **SLO}],
        "oracle": {"num_train_iters": 10}})
    service = OracleService(JanusSettings(nats_url=nats_url, instance="om-oracle", state_dir=tmp_path,
                                          metrics_port=0), cluster)
    started_s = time.time()
    task = asyncio.create_task(run_service(service, install_signals=False))
    try:
        url = await wait_for(lambda: service.metrics_url, what="metrics listener", timeout_s=30.0)

        async def fitted():  # the background refitter fits both GPs from the training set
            text = await scrape(url)
            return text if all(samples(text, "janus_oracle_source", model=MODEL, kind=kind, source="gp") == [1.0]
                               for kind in ("capacity", "elasticity")) else None

        text = await wait_for(fitted, what="GPs fitted from the default training set", timeout_s=90.0,
                              interval_s=0.1)
        for kind in ("capacity", "elasticity"):
            # the synthetic set holds one capacity and one elasticity sample per grid point
            assert samples(text, "janus_oracle_training_points", model=MODEL, kind=kind) == [float(len(grid))]
            assert samples(text, "janus_oracle_refits_total", model=MODEL, kind=kind)[0] >= 1
            assert samples(text, "janus_oracle_refit_failures_total", model=MODEL, kind=kind) == [0.0]
            (last_fit,) = samples(text, "janus_oracle_last_fit_unix_seconds", model=MODEL, kind=kind)
            assert started_s - 1.0 <= last_fit <= time.time() + 1.0
            assert samples(text, "janus_oracle_fit_age_seconds", model=MODEL, kind=kind)[0] >= 0.0
            # the broken file was skipped: the other model answers from its roofline
            assert samples(text, "janus_oracle_source", model=COLD, kind=kind, source="roofline") == [1.0]
            assert samples(text, "janus_oracle_training_points", model=COLD, kind=kind) == [0.0]

        # two serving replicas (heartbeats), then the dispatcher's windows
        publisher = await bus_factory("om-dispatcher")
        await publisher.publish(subjects.worker_telemetry("om-w1"), heartbeat("om-w1", MODEL, 2))
        await wait_for(lambda: service.num_replicas(MODEL) == 2, what="the replica count from the heartbeat",
                       timeout_s=30.0)
        first_end_ms = service.replica_counts.since_ms(MODEL) + 20_000.0  # the count held a window before the first
        for i in range(NUM_WINDOWS):
            rate_rps = 10.0 * (i + 1)
            # windows that do not overlap (the oracle learns one per window length per model)
            await publisher.publish(subjects.model_telemetry(MODEL), ModelLoadWindow(
                model=MODEL, window_s=10.0, end_unix_ms=first_end_ms + i * 10_000.0, num_requests=int(rate_rps * 10),
                request_rate_rps=rate_rps, features=GridPoint(rate_rps, CHAT, 2).features,
                ttft_attainment=1.0 - 0.1 * i))

        async def scored():
            text = await scrape(url)
            return text if samples(text, "janus_oracle_windows_scored_total", model=MODEL, source="gp") == \
                [float(NUM_WINDOWS)] else None

        text = await wait_for(scored, what=f"{NUM_WINDOWS} windows scored against the GP", timeout_s=30.0,
                              interval_s=0.1)
        (error,) = samples(text, "janus_oracle_attainment_abs_error", model=MODEL)
        (coverage,) = samples(text, "janus_oracle_attainment_coverage", model=MODEL)
        (bias,) = samples(text, "janus_oracle_attainment_bias", model=MODEL)
        assert 0.0 <= error <= 1.0 and 0.0 <= coverage <= 1.0 and abs(bias) <= error + 1e-9
        assert samples(text, "janus_oracle_attainment_error_windows", model=MODEL) == [float(NUM_WINDOWS)]
        assert samples(text, "janus_oracle_attainment_measured", model=MODEL) == \
            [1.0 - 0.1 * (NUM_WINDOWS - 1)]
        assert samples(text, "janus_oracle_samples", model=MODEL, kind="elasticity") == \
            [float(len(grid) + NUM_WINDOWS)]  # and learnt, after being scored

        detail = service.health().detail
        assert detail["gp.elasticity"] == MODEL and detail["gp.capacity"] == MODEL
        assert detail["training_sets"] == str(tmp_path / "oracle" / f"{MODEL}.json")
        assert detail[f"{MODEL}.elasticity"].startswith("gp-") and detail[f"{COLD}.elasticity"].startswith("roofline")
        assert float(detail[f"{MODEL}.attainment_abs_error"]) == round(error, 4)
    finally:
        service.stopped.set()
        await asyncio.wait_for(task, 60.0)
