"""`janus audit`: follow the plan audit stream (JetStream PLANS) live, or replay it from a time, as text or JSON.

    janus audit                       # follow new events live
    janus audit --since 10m           # replay the last 10 minutes, then stop
    janus audit --since 2026-01-02T03:00:00Z --follow --json
    janus audit --all --kind action --plan elastic-x-000042
    janus audit --verify              # check the hash chain of every event kept: exit 1 if broken
"""
from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import datetime, timezone

from contracts import subjects

from .audit_format import format_json, format_text, parse_event, parse_since, plan_id_of


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="janus audit", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nats", help="NATS URL (default $JANUS_NATS_URL, else <state-dir>/nats.url of a `janus up`)")
    p.add_argument("--state-dir", help="a `janus up` state dir whose NATS URL and operator login to use (default .janus)")
    start = p.add_mutually_exclusive_group()
    start.add_argument("--since", help="replay from this ISO-8601 time or this long ago (90s, 10m, 2h, 1d)")
    start.add_argument("--all", action="store_true", help="replay from the first event kept")
    p.add_argument("--follow", action="store_true", help="after a replay, keep following (default without one)")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--kind", action="append", choices=["steady", "elastic", "action", "status"], help="only these (repeatable)")
    p.add_argument("--plan", help="only the events of this plan id")
    p.add_argument("--limit", type=int, help="stop after this many events")
    p.add_argument("--verify", action="store_true",
                   help="read every event kept and check that each names the digest of the one before (exit 1 if not)")
    return p


async def audit(args: argparse.Namespace, out=sys.stdout) -> int:
    from nats.js.api import ConsumerConfig, DeliverPolicy
    from nats.js.errors import NotFoundError

    from runtime.tools import connect_tool, nats_target, settings_for

    # --nats, $JANUS_NATS_URL or the state dir's nats.url; the read-only operator of a `janus up` cluster, if any
    target = nats_target(settings_for(getattr(args, "state_dir", None)), args.nats)
    is_replay = bool(args.since or args.all)
    is_follow = args.follow or not is_replay
    bus = await connect_tool("audit", target)  # ToolConnectError: one line, within seconds (main)
    sub = None
    try:
        try:
            info = await bus.js.stream_info(subjects.PLANS_STREAM)
        except NotFoundError:
            print(f"janus audit: no stream {subjects.PLANS_STREAM} on {target.url} (no planner has run)",
                  file=sys.stderr)
            return 2
        last_seq = info.state.last_seq
        if getattr(args, "verify", False):  # callers may build the Namespace by hand
            return await _verify(bus, info.state.first_seq, last_seq, out)
        if args.since:
            when = parse_since(args.since, datetime.now(timezone.utc))
            config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_TIME,
                                    opt_start_time=when.strftime("%Y-%m-%dT%H:%M:%S.%fZ"))
        else:
            config = ConsumerConfig(deliver_policy=DeliverPolicy.ALL if args.all else DeliverPolicy.NEW)
        # stream= named: else nats-py looks the stream up by subject ($JS.API.STREAM.NAMES, not the operator's to use)
        sub = await bus.js.subscribe(subjects.PLAN_WILDCARD, stream=subjects.PLANS_STREAM, ordered_consumer=True,
                                     config=config)
        num_shown = 0
        while args.limit is None or num_shown < args.limit:
            try:
                # Replaying: a quiet second means the stored events are done (or none were after --since).
                msg = await sub.next_msg(timeout=None if is_follow else 1.0)
            except asyncio.TimeoutError:
                break
            except Exception as exc:  # noqa: BLE001 - nats raises its own TimeoutError type
                if type(exc).__name__ == "TimeoutError":
                    break
                raise
            seq = msg.metadata.sequence.stream
            try:
                kind, event = parse_event(msg.subject, msg.data)
            except ValueError as exc:
                print(f"# seq {seq}: skipped: {exc}", file=out)
                continue
            if (not args.kind or kind in args.kind) and (not args.plan or plan_id_of(event) == args.plan):
                print(format_json(kind, event, seq, msg.subject) if args.json else format_text(kind, event),
                      file=out, flush=True)
                num_shown += 1
            if not is_follow and seq >= last_seq:
                break
        return 0
    finally:
        if sub is not None:
            try:
                await sub.unsubscribe()
            except Exception:  # noqa: BLE001 - already gone
                pass
        await bus.close()


async def _verify(bus, first_seq: int, last_seq: int, out) -> int:
    """Replay every event kept and check the chain (planner/audit_chain.py); 0 intact, 1 broken."""
    from nats.js.api import ConsumerConfig, DeliverPolicy

    from .audit_chain import StoredEvent, verify_chain

    events: list[StoredEvent] = []
    if last_seq >= first_seq:
        sub = await bus.js.subscribe(subjects.PLAN_WILDCARD, stream=subjects.PLANS_STREAM, ordered_consumer=True,
                                     config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL))
        try:
            while True:
                try:  # a quiet 2 s: the tail is gone (removed events are not delivered)
                    msg = await sub.next_msg(timeout=2.0)
                except Exception as exc:  # noqa: BLE001 - nats raises its own TimeoutError type
                    if type(exc).__name__ == "TimeoutError":
                        break
                    raise
                events.append(StoredEvent(msg.metadata.sequence.stream, msg.subject, msg.data))
                if events[-1].seq >= last_seq:
                    break
        finally:
            try:
                await sub.unsubscribe()
            except Exception:  # noqa: BLE001 - already gone
                pass
    report = verify_chain(events, first_seq=first_seq, last_seq=last_seq)
    for problem in report.problems:
        print(f"# {problem}", file=out)
    print(report.summary(), file=out, flush=True)
    return 0 if report.is_intact else 1


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.since:
        try:
            parse_since(args.since, datetime.now(timezone.utc))
        except ValueError as exc:
            print(f"janus audit: {exc}", file=sys.stderr)
            return 2
    from runtime.tools import EXIT_NO_NATS, ToolConnectError, quiet_connection_warnings

    quiet_connection_warnings()
    try:
        return asyncio.run(audit(args))
    except KeyboardInterrupt:
        return 0
    except ToolConnectError as exc:
        print(f"janus audit: {exc}", file=sys.stderr, flush=True)
        return EXIT_NO_NATS
