"""JetStream set-up shared by services: the PLANS stream and the `instances` KV bucket, created idempotently."""
from __future__ import annotations

import asyncio
import logging

from nats.js.api import KeyValueConfig, StorageType, StreamConfig
from nats.js.errors import BadRequestError, BucketNotFoundError, NotFoundError

log = logging.getLogger("janus.jetstream")


async def ensure_kv(js, bucket: str, *, history: int = 1, ttl_s: float | None = None):
    """The bucket, created when missing. Several services may race to create it: the loser just opens it."""
    for _ in range(5):
        try:
            return await js.key_value(bucket)
        except (BucketNotFoundError, NotFoundError):
            pass
        try:
            return await js.create_key_value(KeyValueConfig(bucket=bucket, history=history, ttl=ttl_s,
                                                            storage=StorageType.FILE))
        except BadRequestError:
            await asyncio.sleep(0.05)  # created meanwhile by someone else
    return await js.key_value(bucket)


async def ensure_stream(js, name: str, subjects: list[str], *, max_age_s: float | None = None,
                        num_replicas: int = 1) -> None:
    config = StreamConfig(name=name, subjects=subjects, max_age=max_age_s, storage=StorageType.FILE,
                          num_replicas=num_replicas)
    try:
        await js.stream_info(name)
        await js.update_stream(config)
    except NotFoundError:
        try:
            await js.add_stream(config)
        except BadRequestError:
            log.debug("stream %s created concurrently", name)
