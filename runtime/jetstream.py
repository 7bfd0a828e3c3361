"""JetStream set-up shared by services: the PLANS stream and the `instances` KV bucket, created idempotently.

A fresh or recovering NATS cluster answers JetStream requests only once it has a meta leader, so set-up retries
for a while instead of failing the service at start."""
from __future__ import annotations

import asyncio
import dataclasses
import logging

from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import KeyValueConfig, StorageType, StreamConfig
from nats.js.errors import BadRequestError, BucketNotFoundError, NoStreamResponseError, NotFoundError, ServiceUnavailableError

log = logging.getLogger("janus.jetstream")

_NOT_READY = (NoRespondersError, NoStreamResponseError, NatsTimeoutError, asyncio.TimeoutError, ServiceUnavailableError)


async def _retrying(op, what: str, timeout_s: float):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            return await op()
        except _NOT_READY as exc:
            if loop.time() > deadline:
                raise RuntimeError(f"JetStream did not answer for {what} within {timeout_s} s: {exc!r}") from exc
            await asyncio.sleep(0.25)


async def ensure_kv(js, bucket: str, *, history: int = 1, ttl_s: float | None = None, num_replicas: int = 1,
                    timeout_s: float = 30.0):
    """The bucket, created when missing. Several services may race to create it: the loser just opens it. An
    existing bucket whose entries expire after another `ttl_s` than asked (a lease policy changed since it was made)
    gets the TTL asked: its entries' expiry is the stream's max age."""

    async def once():
        try:
            kv = await js.key_value(bucket)
        except (BucketNotFoundError, NotFoundError):
            pass
        else:
            if ttl_s is not None:
                await _bring_ttl_to(js, bucket, ttl_s)
            return kv
        try:
            return await js.create_key_value(KeyValueConfig(bucket=bucket, history=history, ttl=ttl_s,
                                                            storage=StorageType.FILE, replicas=num_replicas))
        except BadRequestError:
            return await js.key_value(bucket)  # created meanwhile by someone else

    return await _retrying(once, f"KV bucket {bucket}", timeout_s)


async def _bring_ttl_to(js, bucket: str, ttl_s: float) -> None:
    info = await js.stream_info(f"KV_{bucket}")
    if info.config.max_age is not None and abs(info.config.max_age - ttl_s) < 1e-3:
        return
    # the server refuses a duplicates window longer than the max age (a KV stream's is the TTL, or 2 min)
    window_s = min(info.config.duplicate_window or ttl_s, ttl_s)
    await js.update_stream(dataclasses.replace(info.config, max_age=ttl_s, duplicate_window=window_s))
    log.warning("KV bucket %s: entries now expire after %s s (were %s s)", bucket, ttl_s, info.config.max_age)


async def kv_put(kv, key: str, value: bytes, *, timeout_s: float = 20.0) -> int:
    """Put, waiting out a stream without a leader: a bucket created a moment ago on a three-node cluster, or one
    whose leader's node was just lost, answers "no responders" until its replicas elect one (seconds)."""
    return await _retrying(lambda: kv.put(key, value), f"KV put {key}", timeout_s)


async def watch_all(kv, *, timeout_s: float = 30.0):
    """A watcher over every key, from a snapshot: creating its consumer is a JetStream request, which times out
    while the bucket's stream elects a leader (its node lost)."""
    return await _retrying(kv.watchall, "a KV watch", timeout_s)


async def open_kv(js, bucket: str, *, interval_s: float = 0.5):
    """The bucket, once someone has created it: for readers (the gateway's status page, `janus status`) whose NATS
    user may not create buckets. Waits for it as long as it takes (cancel to stop)."""
    while True:
        try:
            return await js.key_value(bucket)
        except (BucketNotFoundError, NotFoundError, *_NOT_READY):
            await asyncio.sleep(interval_s)


async def ensure_stream(js, name: str, subjects: list[str], *, max_age_s: float | None = None,
                        num_replicas: int = 1, is_append_only: bool = False, timeout_s: float = 30.0) -> None:
    """The stream, created when missing, else updated to this configuration. `is_append_only`: the server refuses
    to delete or purge its messages (deny_delete, deny_purge), whoever asks; only `max_age_s` ages them out."""
    config = StreamConfig(name=name, subjects=subjects, max_age=max_age_s, storage=StorageType.FILE,
                          num_replicas=num_replicas, deny_delete=is_append_only,
                          deny_purge=is_append_only)

    async def once():
        try:
            await js.stream_info(name)
            await js.update_stream(config)
        except NotFoundError:
            try:
                await js.add_stream(config)
            except BadRequestError:
                log.debug("stream %s created concurrently", name)

    await _retrying(once, f"stream {name}", timeout_s)


async def instances_bucket(js, cluster) -> object:
    """The `instances` registry, replicated as the cluster config says (3 on a three-node NATS cluster)."""
    from contracts import subjects

    return await ensure_kv(js, subjects.INSTANCES_BUCKET, num_replicas=cluster.jetstream_replicas)
