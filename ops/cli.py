"""The `janus` command."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

from runtime.settings import DEVICE_ENV, JanusSettings

# Commands whose implementation lives with its package: name -> "module:function(argv) -> int"
DELEGATED = {
    "sim": ("sim.cli:main", "run the cluster simulator on a trace, with baselines and plots"),
    "replay": ("sim.trace_client:main", "send a trace open-loop to a live gateway and report what clients saw"),
    "audit": ("planner.audit:main", "follow or replay the plan audit stream (JetStream PLANS)"),
    "status": ("runtime.status:main", "devices, resident models, pools, replicas and queues"),
}


def _settings(args: argparse.Namespace) -> JanusSettings:
    overrides = {}
    if getattr(args, "nats", None):
        overrides["nats_url"] = args.nats
    if getattr(args, "config", None):
        overrides["config"] = args.config
    if getattr(args, "id", None):
        overrides["instance"] = args.id
    if getattr(args, "state_dir", None):
        overrides["state_dir"] = args.state_dir
    return JanusSettings(**overrides)


def cmd_serve(args: argparse.Namespace) -> int:
    from runtime.service import configure_logging, run_service

    from .effective import load_cluster
    from .preflight import check_checkpoints
    from .services import load_service_class

    settings = _settings(args)
    cluster = load_cluster(settings.config)  # a mistake: one line naming the YAML path, exit 2 (main)
    if args.service == "worker":  # the one that loads checkpoints: refused before it opens a device or NATS
        check_checkpoints(cluster, settings.models_dir, str(settings.config or "default cluster config"))
    configure_logging(settings.log_level)
    cls = load_service_class(args.service)
    kwargs = {}
    if args.service == "gateway" and args.port is not None:
        kwargs["port"] = args.port
    if args.service == "worker":
        kwargs["worker_id"] = settings.instance
        kwargs["device"] = args.device or os.environ.get(DEVICE_ENV) or None  # `janus up` sets one per worker
    service = cls(settings, cluster, **kwargs)
    asyncio.run(run_service(service))
    return 0


def joining_worker_id(device: str | None, host_name: str) -> str:
    """A joining worker's id when none is given: the machine's name and its device (`gpu1-cuda3`), unique in a
    cluster as long as machine names are."""
    return f"{host_name}-{(device or 'worker').replace(':', '')}"


def cmd_join(args: argparse.Namespace) -> int:
    """`janus join`: a worker on this machine joins a running cluster (docs/operations.md, "Several machines")."""
    import socket

    device = args.device or os.environ.get(DEVICE_ENV) or None
    args.id = args.id or joining_worker_id(device, socket.gethostname())
    args.service, args.port = "worker", None
    return cmd_serve(args)


def cmd_up(args: argparse.Namespace) -> int:
    from runtime.service import configure_logging

    from .effective import load_cluster
    from .launcher import dry_run_lines, is_profiling_skipped, profile_on_first_start, run_up, worker_devices
    from .preflight import check_checkpoints

    settings = _settings(args)
    configure_logging("WARNING")
    cluster = load_cluster(settings.config)  # a mistake: one line naming the YAML path, exit 2 (main)
    # files, architecture and page fit of each checkpoint, before any process (or the state dir) is made
    check_checkpoints(cluster, settings.models_dir, str(settings.config or "default cluster config"))
    if args.nats_nodes > 1 and cluster.jetstream_replicas == 1:
        cluster = cluster.model_copy(update={"jetstream_replicas": min(3, args.nats_nodes)})
    devices = worker_devices(cluster, args.workers or cluster.workers.count)  # ConfigError: one line, exit 2
    if args.dry_run:
        port = cluster.gateway.port if args.port is None else args.port
        try:
            print("\n".join(dry_run_lines(cluster, devices, port, args.nats_nodes)), flush=True)
        except BrokenPipeError:  # `janus up --dry-run | head`
            sys.stdout = open(os.devnull, "w")
        return 0
    if not (args.no_profile or is_profiling_skipped()):
        try:
            profile_on_first_start(settings, cluster)
        except KeyboardInterrupt:
            print("\njanus: interrupted while profiling; nothing was started (the next `janus up` profiles what is "
                  "still missing)", file=sys.stderr, flush=True)
            return 130
    return asyncio.run(run_up(settings, cluster, config_path=settings.config, gateway_port=args.port,
                              num_workers=args.workers, num_nats_nodes=args.nats_nodes))


def cmd_profile(args: argparse.Namespace) -> int:
    """`janus profile --model NAME`: the model's TrainingSet, measured on this CPU, in <state_dir>/oracle/NAME.json."""
    from .effective import ConfigError, load_cluster
    from .launcher import profile_target, training_set_path

    settings = _settings(args)
    cluster = load_cluster(settings.config)
    spec, model_dir = profile_target(cluster, args.model, settings.models_dir)  # ConfigError: one line, exit 2
    out = Path(args.out) if args.out else training_set_path(settings.state_dir, spec.name)

    from oracle.profile.run import FULL, QUICK, estimate_s, format_duration, partial_path

    from .profile import profile_engine

    plan = QUICK if args.quick else FULL
    ttft = args.ttft_slo_ms or plan.harness_settings().ttft_slo_ms
    tpot = args.tpot_slo_ms or plan.harness_settings().tpot_slo_ms
    from oracle.core.policy import OraclePolicy

    try:
        lifetime_answer = OraclePolicy.from_knobs(cluster.oracle).profile_lifetime_answer
        settings_ = plan.harness_settings(ttft_slo_ms=ttft, tpot_slo_ms=tpot, seed=args.seed,
                                          max_num_seqs=cluster.workers.max_num_seqs,
                                          hbm_bytes=cluster.workers.pool_bytes, lifetime_answer=lifetime_answer)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    print(f"janus profile: {spec.name} ({model_dir}) on this CPU, {plan.name} plan: {plan.num_points} points, "
          f"about {format_duration(estimate_s(plan))} on a 2-core machine; SLOs of the profile: TTFT {ttft:g} ms, "
          f"TPOT {tpot:g} ms of engine time (the cluster config says {spec.ttft_slo_ms:g} / {spec.tpot_slo_ms:g} ms)",
          flush=True)
    try:
        result = profile_engine(model_dir, out, model=spec.name, plan=plan, settings=settings_,
                                extra_meta={"command": "janus profile", "configured_slo_ms":
                                            {"ttft": spec.ttft_slo_ms, "tpot": spec.tpot_slo_ms}})
    except KeyboardInterrupt:
        print(f"\njanus profile: interrupted; {out} not written (what was measured is in {partial_path(out)})",
              file=sys.stderr, flush=True)
        return 130
    except ValueError as exc:  # a checkpoint the profiler cannot drive (KV budget, config): one line
        raise ConfigError(f"{spec.name}: {exc}") from None
    print(f"janus profile: {result.summary()}", flush=True)
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    from .effective import effective_config, load_cluster

    settings = _settings(args)
    out = effective_config(load_cluster(settings.config), redact_secrets=not args.show_secrets)
    try:
        print(json.dumps(out["policy"] if args.policies_only else out, indent=2), flush=True)
    except BrokenPipeError:  # `janus config | head`
        sys.stdout = open(os.devnull, "w")
    return 0


def cmd_contracts(args: argparse.Namespace) -> int:
    from contracts.catalog import ROUTES, json_schema

    if args.json:
        out = [{"subject": r.subject, "from": r.sender, "to": r.receivers,
                "payload": json_schema(r.payload) if r.payload is not None else None,
                "reply": json_schema(r.reply) if r.reply is not None else None} for r in ROUTES]
        print(json.dumps(out, indent=2))
        return 0
    for r in ROUTES:
        payload = getattr(r.payload, "__name__", None) or ("StreamEvent" if r.payload is not None else "-")
        reply = getattr(r.reply, "__name__", "") if r.reply is not None else ""
        print(f"{r.subject}\n  {r.sender} -> {r.receivers}\n  payload: {payload}" + (f"  reply: {reply}" if reply
                                                                                     else ""))
        if r.payload is not None:
            print("  schema: " + json.dumps(json_schema(r.payload), separators=(",", ":")))
        print()
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    settings = _settings(args)
    out = Path(args.out) if args.out else settings.models_dir
    if args.action == "make-demo":
        from worker.engine.demo import make_demo_models

        for name, path in make_demo_models(out, args.name or None).items():
            print(f"{name}\t{path}")
        return 0
    from worker.engine.demo import DEMO_MODELS

    for name, spec in DEMO_MODELS.items():
        present = (out / name / "config.json").exists()
        print(f"{name}\t{'written' if present else 'not written'}\t{spec}")
    return 0


def cmd_nats_config(args: argparse.Namespace) -> int:
    from runtime.security import load_or_create_credentials, write_compose_env, write_nats_config, write_password_env

    out = Path(args.out)
    creds = load_or_create_credentials(out / "credentials.json")  # kept: a second run rewrites the same passwords
    conf = write_nats_config(out / "nats.conf", creds, tls_cert=args.tls_cert, tls_key=args.tls_key,
                             tls_ca=args.tls_ca)
    env = write_password_env(out / "passwords.env", creds)
    compose = write_compose_env(out / "compose.env", creds, conf)
    print(f"wrote {conf} (include it in each NATS server's configuration), {out / 'credentials.json'}, {env} "
          f"and {compose} (give each service its own user: JANUS_NATS_USER / JANUS_NATS_PASSWORD; passwords.env is "
          f"what deploy/k8s makes its Secret of; `docker compose --env-file {compose} up` runs NATS with these "
          "users); all are mode 0600")
    return 0


def cmd_trace(args: argparse.Namespace) -> int:
    """`janus trace ID`: the request's spans, from the files `janus up`'s services write (runtime/trace_file.py)."""
    import shutil

    from runtime.trace_file import TRACE_DIR_ENV, read_trace
    from runtime.trace_view import parse_trace_id, waterfall

    try:
        trace_id = parse_trace_id(args.trace_id)
    except ValueError as exc:
        print(f"janus trace: {exc}", file=sys.stderr)
        return 2
    folder = Path(args.dir) if args.dir else (Path(os.environ[TRACE_DIR_ENV]) if os.environ.get(TRACE_DIR_ENV)
                                              else _settings(args).state_dir / "traces")
    spans = read_trace(folder, trace_id)
    if not spans:
        print(f"janus trace: no spans of {trace_id} in {folder} (spans are written there by `janus up` unless "
              "OTEL_EXPORTER_OTLP_ENDPOINT sends them to a collector; a request's last spans take about a second "
              "to arrive; --state-dir or --dir says where to look)", file=sys.stderr)
        return 1
    width = args.width or shutil.get_terminal_size((120, 24)).columns
    try:
        print("\n".join(waterfall(spans, width)), flush=True)
    except BrokenPipeError:  # `janus trace ID | head`
        sys.stdout = open(os.devnull, "w")
    return 0


def _delegate(name: str, argv: list[str]) -> int:
    import importlib

    target, _ = DELEGATED[name]
    module, func = target.split(":")
    try:
        fn = getattr(importlib.import_module(module), func)
    except (ModuleNotFoundError, AttributeError):
        print(f"janus {name}: not available in this build ({target} is missing)", file=sys.stderr)
        return 2
    return int(fn(argv) or 0)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="janus", description="Janus: multi-LLM serving on a shared fleet")
    sub = p.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="start NATS and every service locally, with demo models")
    up.add_argument("--config", type=Path, help="cluster YAML (default: built-in demo cluster)")
    up.add_argument("--port", type=int, help="gateway port (0 picks a free one; default from config: 8000)")
    up.add_argument("--workers", type=int, help="number of worker processes")
    up.add_argument("--state-dir", type=Path, help="where models, NATS data and logs go (default .janus)")
    up.add_argument("--nats-nodes", type=int, default=1, help="run NATS as a cluster of this many nodes")
    up.add_argument("--dry-run", action="store_true", help="print the processes it would start (ids, devices, "
                    "addresses) and exit without starting any")
    up.add_argument("--no-profile", action="store_true",
                    help="do not profile the demo models that have no oracle training set yet (also: "
                         "JANUS_NO_PROFILE=1); their oracle answers from the roofline")
    up.set_defaults(fn=cmd_up)

    prof = sub.add_parser("profile", help="measure a model's engine on this CPU: the oracle's training set "
                          "(<state_dir>/oracle/NAME.json)")
    prof.add_argument("--model", required=True, help="a model of the cluster config (or a demo model)")
    prof.add_argument("--config", type=Path, help="cluster YAML (default: $JANUS_CONFIG, else the demo cluster)")
    prof.add_argument("--quick", action="store_true",
                      help="27 points instead of 45, shorter runs: minutes, at the price of accuracy (docs/oracle.md)")
    prof.add_argument("--out", type=Path, help="where to write (default <state_dir>/oracle/NAME.json)")
    prof.add_argument("--state-dir", type=Path, help="default .janus")
    prof.add_argument("--ttft-slo-ms", type=float, help="TTFT SLO the profile measures against (default 100)")
    prof.add_argument("--tpot-slo-ms", type=float, help="TPOT SLO the profile measures against (default 10)")
    prof.add_argument("--seed", type=int, default=0)
    prof.set_defaults(fn=cmd_profile)

    config = sub.add_parser("config", help="the effective cluster configuration as JSON, every policy knob expanded")
    config.add_argument("--config", type=Path, help="cluster YAML (default: $JANUS_CONFIG, else the built-in "
                        "demo cluster)")
    config.add_argument("--policies-only", action="store_true", help="only the planner and dispatcher policies")
    config.add_argument("--show-secrets", action="store_true", help="print gateway API keys instead of masking them")
    config.set_defaults(fn=cmd_config)

    serve = sub.add_parser("serve", help="run one service (what docker-compose and `janus up` run)")
    serve.add_argument("service")
    serve.add_argument("--nats", help="NATS URL (default $JANUS_NATS_URL)")
    serve.add_argument("--config", type=Path)
    serve.add_argument("--id", help="instance name (worker id for workers)")
    serve.add_argument("--port", type=int, help="gateway HTTP port")
    serve.add_argument("--device", help=f"a worker's device, e.g. cuda:3 (default ${DEVICE_ENV}, else "
                       "workers.device)")
    serve.add_argument("--state-dir", type=Path)
    serve.set_defaults(fn=cmd_serve)

    join = sub.add_parser("join", help="run a worker on this machine in a running cluster (`janus serve worker`, "
                          "named by the machine and its device unless --id says otherwise)")
    join.add_argument("--nats", required=True, help="the cluster's NATS URLs, comma-separated")
    join.add_argument("--config", type=Path, help="the cluster YAML every machine reads (default $JANUS_CONFIG)")
    join.add_argument("--id", help="worker id, unique in the cluster (default: <machine name>-<device>)")
    join.add_argument("--device", help=f"its device, e.g. cuda:3 (default ${DEVICE_ENV}, else workers.device)")
    join.add_argument("--state-dir", type=Path)
    join.set_defaults(fn=cmd_join)

    contracts = sub.add_parser("contracts", help="every subject with its payload's JSON schema")
    contracts.add_argument("--json", action="store_true")
    contracts.set_defaults(fn=cmd_contracts)

    models = sub.add_parser("models", help="demo checkpoints")
    models.add_argument("action", choices=["make-demo", "list"])
    models.add_argument("--out", help="folder (default .janus/models)")
    models.add_argument("--name", action="append", help="only this demo model (repeatable)")
    models.add_argument("--state-dir", type=Path)
    models.set_defaults(fn=cmd_models)

    natsc = sub.add_parser("nats-config", help="NATS users per service with subject permissions, for production")
    natsc.add_argument("--out", required=True, help="folder for nats.conf and credentials.json")
    natsc.add_argument("--tls-cert", type=Path)
    natsc.add_argument("--tls-key", type=Path)
    natsc.add_argument("--tls-ca", type=Path)
    natsc.set_defaults(fn=cmd_nats_config)

    tr = sub.add_parser("trace", help="a request's spans as a waterfall (the id is the x-janus-trace-id header)")
    tr.add_argument("trace_id", help="32 hex digits, or a traceparent")
    tr.add_argument("--state-dir", type=Path, help="default .janus: spans are read from <state-dir>/traces")
    tr.add_argument("--dir", type=Path, help="read spans from this folder instead (default $JANUS_TRACE_DIR, "
                    "else <state-dir>/traces)")
    tr.add_argument("--width", type=int, help="columns (default: the terminal's)")
    tr.set_defaults(fn=cmd_trace)

    for name, (_, help_text) in DELEGATED.items():
        d = sub.add_parser(name, help=help_text, add_help=False)
        d.set_defaults(fn=None, delegated=name)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATED:
        return _delegate(argv[0], argv[1:])
    args = build_parser().parse_args(argv)
    from .effective import ConfigError

    try:
        return int(args.fn(args) or 0)
    except ConfigError as e:
        print(f"janus {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
