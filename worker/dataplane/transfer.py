"""The worker's Mooncake transfer engine: one per worker process, addressed by its session name "host:rpc_port".

A worker registers its device pool's global region (worker/xtensor `global_region`) first, so a peer learns the
region's base with `get_first_buffer_address(session)` and then reads weight pages or writes KV pages at base +
global offset. Offsets, never raw addresses, travel over NATS (heartbeat `transfer_session` and `weight_segments`,
`KVTarget.block_offsets_bytes`). A WARM instance's host copy is registered too, and offered at its signed offset
from that base (`HostCopy.base_offset_bytes`).

Calls block (the engine moves the bytes on its own threads); async callers run them with `asyncio.to_thread`.
CPU machines use `mooncake-transfer-engine-non-cuda` over TCP; GPU hosts the CUDA build, protocol "rdma".
"""
from __future__ import annotations

import ipaddress
import logging
import socket
import threading
from dataclasses import dataclass
from typing import Sequence
from urllib.parse import urlsplit

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from ..shell.process_env import quiet_mooncake_logs

log = logging.getLogger("janus.worker.transfer")


class TransferError(RuntimeError):
    """A transfer failed or the transfer engine cannot run here; the message says which and why."""


class TransferSettings(BaseSettings):
    """JANUS_TRANSFER_* environment: where this worker's transfer engine listens and over what."""

    model_config = SettingsConfigDict(env_prefix="JANUS_TRANSFER_", extra="ignore", frozen=True)

    host: str = Field(default="", description="the address peers reach this worker's engine at; empty: the "
                      "address of the interface that reaches NATS (transfer_settings)")
    protocol: str = Field(default="tcp", description='"tcp" (CPU build) or "rdma" (CUDA build with NICs)')
    metadata_server: str = "P2PHANDSHAKE"
    device_name: str = Field(default="", description="RDMA NICs to use; empty: all")
    max_chunk_bytes: int = Field(default=64 << 20, gt=0, description="one transfer request at most this long")


def host_reaching(nats_urls: str, fallback: str = "127.0.0.1") -> str:
    """This machine's address on the interface that reaches the NATS servers of `nats_urls` (comma-separated): on a
    host with several interfaces, the one its peers (which reach the same NATS) can reach too. The first URL that
    resolves to a route off this machine decides; a URL reached over loopback (a NATS node on this machine, often
    listed first) says nothing about where the peers are, so it counts only when no URL leads elsewhere. A UDP
    connect picks the route and sends nothing."""
    loopback = None
    for url in nats_urls.split(","):
        parts = urlsplit(url.strip() if "://" in url else f"nats://{url.strip()}")
        if not parts.hostname:
            continue
        try:
            family, kind, proto, _, address = socket.getaddrinfo(parts.hostname, parts.port or 4222,
                                                                 type=socket.SOCK_DGRAM)[0]
            with socket.socket(family, kind, proto) as probe:
                probe.connect(address)
                local = probe.getsockname()[0]
        except OSError:  # unresolvable or unroutable: try the next server
            continue
        if not ipaddress.ip_address(local).is_loopback:
            return local
        loopback = loopback or local
    return loopback or fallback


def transfer_settings(nats_urls: str) -> TransferSettings:
    """JANUS_TRANSFER_* as set, the host taken from the interface that reaches NATS when JANUS_TRANSFER_HOST is
    unset (a worker on another machine than its peers must not advertise 127.0.0.1)."""
    settings = TransferSettings()
    return settings if settings.host else settings.model_copy(update={"host": host_reaching(nats_urls)})


@dataclass(frozen=True)
class TransferStats:
    num_transfers: int
    num_bytes: int


class MooncakeTransfer:
    """A started transfer engine. Build with `MooncakeTransfer.start(settings)`; `close()` when done."""

    def __init__(self, engine, settings: TransferSettings) -> None:
        self._engine = engine
        self.settings = settings
        self.session = f"{settings.host}:{engine.get_rpc_port()}"
        self._registered: dict[int, int] = {}
        self._remote_bases: dict[str, int] = {}
        self._lock = threading.Lock()
        self._num_transfers = 0
        self._num_bytes = 0

    @classmethod
    def start(cls, settings: TransferSettings | None = None) -> "MooncakeTransfer":
        settings = settings or transfer_settings("")
        if not settings.host:  # no NATS to find an interface by: this machine only
            settings = settings.model_copy(update={"host": "127.0.0.1"})
        quiet_mooncake_logs()  # before the library loads: it reads its log level then (worker/shell/process_env.py)
        try:
            from mooncake.engine import TransferEngine
        except ImportError as exc:
            raise TransferError(f"the Mooncake transfer engine is not installed ({exc}); install "
                                "mooncake-transfer-engine-non-cuda (CPU) or the CUDA build") from None
        engine = TransferEngine()
        rc = engine.initialize(settings.host, settings.metadata_server, settings.protocol, settings.device_name)
        if rc != 0:
            raise TransferError(f"TransferEngine.initialize({settings.host!r}, {settings.metadata_server!r}, "
                                f"{settings.protocol!r}) returned {rc}")
        return cls(engine, settings)

    # ---- memory -----------------------------------------------------------------------------------------------
    def register(self, address: int, num_bytes: int) -> None:
        """Make [address, address + num_bytes) addressable by peers. The first buffer registered is the one peers
        find with `remote_base` (register the device's global region first)."""
        if num_bytes <= 0:
            raise ValueError("num_bytes must be > 0")
        with self._lock:
            if address in self._registered:
                return
            rc = self._live_engine().register_memory(address, num_bytes)
            if rc != 0:
                raise TransferError(f"register_memory({address:#x}, {num_bytes}) returned {rc}")
            self._registered[address] = num_bytes

    @property
    def base_address(self) -> int | None:
        """The first buffer registered (the global region): what peers add offsets to."""
        with self._lock:
            return next(iter(self._registered), None)

    def unregister(self, address: int) -> None:
        with self._lock:
            if self._registered.pop(address, None) is not None:
                self._engine.unregister_memory(address)

    def remote_base(self, peer: str) -> int:
        """The base address of the first buffer `peer` registered (its global region), cached per session."""
        with self._lock:
            base = self._remote_bases.get(peer)
        if base is None:
            base = int(self._live_engine().get_first_buffer_address(peer))
            if base <= 0:
                raise TransferError(f"peer {peer} has registered no memory (or cannot be reached)")
            with self._lock:
                self._remote_bases[peer] = base
        return base

    def forget_peer(self, peer: str) -> None:
        """Drop the cached base of a peer (it restarted: a new process has a new region)."""
        with self._lock:
            self._remote_bases.pop(peer, None)

    # ---- transfers --------------------------------------------------------------------------------------------
    def read(self, peer: str, local_addresses: Sequence[int], remote_offsets: Sequence[int],
             lengths: Sequence[int]) -> int:
        """Copy peer's [base + offset, + length) into local addresses; returns the bytes moved. Raises on failure."""
        return self._transfer("read", peer, local_addresses, remote_offsets, lengths)

    def write(self, peer: str, local_addresses: Sequence[int], remote_offsets: Sequence[int],
              lengths: Sequence[int]) -> int:
        """Copy local addresses into peer's [base + offset, + length); returns the bytes moved."""
        return self._transfer("write", peer, local_addresses, remote_offsets, lengths)

    def _transfer(self, kind: str, peer: str, local_addresses: Sequence[int], remote_offsets: Sequence[int],
                  lengths: Sequence[int]) -> int:
        if not (len(local_addresses) == len(remote_offsets) == len(lengths)):
            raise ValueError("local_addresses, remote_offsets and lengths must have the same length")
        if not lengths:
            return 0
        if any(n <= 0 for n in lengths):
            raise ValueError("lengths must be > 0")
        base = self.remote_base(peer)
        # offsets are signed: a registered host buffer (a warm copy) may lie below the global region
        remote_addresses = [base + o for o in remote_offsets]
        if any(a <= 0 for a in remote_addresses):
            raise ValueError(f"an offset points below address 0 of {peer}")
        locals_, remotes, sizes = _split(local_addresses, remote_addresses, lengths, self.settings.max_chunk_bytes)
        engine = self._live_engine()
        call = engine.batch_transfer_sync_read if kind == "read" else engine.batch_transfer_sync_write
        rc = call(peer, locals_, remotes, sizes)
        if rc != 0:
            self.forget_peer(peer)  # a restarted peer has a new base; look it up again next time
            raise TransferError(f"{kind} of {sum(sizes)} bytes in {len(sizes)} pieces with {peer} failed (rc={rc})")
        with self._lock:
            self._num_transfers += 1
            self._num_bytes += sum(sizes)
        return sum(sizes)

    def stats(self) -> TransferStats:
        with self._lock:
            return TransferStats(self._num_transfers, self._num_bytes)

    def _live_engine(self):
        if self._engine is None:
            raise TransferError(f"the transfer engine {self.session} is closed")
        return self._engine

    @property
    def is_closed(self) -> bool:
        return self._engine is None

    def close(self) -> None:
        """Unregister every buffer and destroy the engine now. The library's destructor stops its threads and takes
        about a second holding the GIL (measured: 1.0 s on the CPU build, whichever thread drops it), so it runs here,
        at the worker's stop, not in whatever later garbage-collection pass would find it: there it stalled every
        thread of the process (in the test suite, 5.6 s in the middle of another cluster's timed run)."""
        for address in list(self._registered):
            try:
                self.unregister(address)
            except Exception:  # noqa: BLE001 - closing anyway
                log.debug("unregister %#x failed", address, exc_info=True)
        self._engine = None  # the last reference: the destructor runs here


def _split(local_addresses: Sequence[int], remote_addresses: Sequence[int], lengths: Sequence[int],
           max_chunk_bytes: int) -> tuple[list[int], list[int], list[int]]:
    """Cut long pieces into chunks of at most max_chunk_bytes: the engine moves a batch's requests in parallel,
    so large chunks overlap instead of one long request holding one connection."""
    out_local, out_remote, out_len = [], [], []
    for local, remote, length in zip(local_addresses, remote_addresses, lengths):
        done = 0
        while done < length:
            n = min(max_chunk_bytes, length - done)
            out_local.append(int(local) + done)
            out_remote.append(int(remote) + done)
            out_len.append(n)
            done += n
    return out_local, out_remote, out_len
