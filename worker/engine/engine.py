"""`LLMEngine`: one model, paged KV, continuous batching; `step()` is the whole loop (schedule, run, sample,
stream).

Threading: `step()` runs in one engine thread. `add_request`, `abort` and the P/D `add_*` calls come from
another thread (the worker's asyncio loop): they validate at once (raising on bad input) and queue the work in an
inbox that `step()` drains first. Calls that must answer at once (`reserve_kv_blocks`, `release_kv_blocks`,
`stats`) take the engine lock, which `step()` holds only while scheduling and post-processing, never during the
model's forward pass.
"""
from __future__ import annotations

import threading
import time
import uuid
import warnings
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence as Seq

import torch

from contracts.requests import MAX_STOP_STRING_CHARS, MAX_STOP_TOKEN_IDS, SEED_LIMIT, SamplingParams
from runtime.tokenizer import IncrementalDetokenizer, TextTokenizer

from .block_manager import BlockManager
from .config import EngineConfig, ModelConfig
from .kv_cache import KVBlockLayout, PagedKVCache
from .kv_pool import PlainKVPageSource, PlainWeightPageSource
from .metrics import EngineMetrics
from .model import CausalLM
from .model_runner import ModelRunner
from .outputs import EngineOutput, EngineStats, StepRecord
from .rope import RotaryEmbedding
from .grammar import GrammarBook
from .sampler import Sampler
from .scheduler import Scheduler
from .sequence import Sequence, SequenceStatus
from .stop import StopStringMatcher
from .choices import ChoicesMixin
from .migration import MigrationMixin
from .pd import PrefillDecodeMixin
from .verify import CanaryResult, WeightVerificationMixin
from .weights import WeightLayout, load_checkpoint

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class _TextStream:
    detokenizer: IncrementalDetokenizer
    stop: StopStringMatcher


def _resolve_dtype(dtype: torch.dtype | str | None, device: torch.device) -> torch.dtype:
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, str):
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
        return _DTYPES[dtype]
    return dtype


class LLMEngine(ChoicesMixin, PrefillDecodeMixin, MigrationMixin, WeightVerificationMixin):
    """A paged-KV inference engine for one Qwen2/Llama-family model in a local Hugging Face folder.

    `kv_source` / `weight_source` are the `worker.engine.memory` interfaces (xTensor on a worker); when None, plain
    pools stand behind the same interfaces. `owner` names this engine to those sources (default: a unique id).
    `load_weights=False` builds the engine without reading the checkpoint: its weight region is taken from the
    weight source but left unfilled (contents undefined) for the caller to fill (a fork's pull, a host copy) before
    any step; `reference_canary` is then the canary it must reproduce, if known.
    P/D entry points: see `pd.PrefillDecodeMixin`; moving a running decode: `migration.MigrationMixin`; weight
    verification and `bind_weights`: `verify`.
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | str | None = None,
        config: EngineConfig | None = None,
        kv_source=None,
        weight_source=None,
        owner: str | None = None,
        load_weights: bool = True,
        reference_canary: CanaryResult | None = None,
    ) -> None:
        self.model_dir = Path(model_dir)
        self.config = config or EngineConfig()
        self.device = torch.device(device)
        self.dtype = _resolve_dtype(dtype, self.device)
        self.model_config = ModelConfig.from_dir(self.model_dir)
        self._tokenizer = TextTokenizer.from_dir(self.model_dir)
        self.owner = owner or f"{self.model_dir.name}-{uuid.uuid4().hex[:8]}"
        mc, cfg = self.model_config, self.config
        self._max_model_len = min(cfg.max_model_len or 8192, mc.max_position_embeddings)
        self._eos_token_ids = frozenset(self._tokenizer.eos_token_ids or mc.eos_token_ids)
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

        # Weights: one flat buffer from the weight source, typed views bound over it.
        self.weight_layout = WeightLayout.for_config(mc, self.dtype)
        self.weight_source = weight_source or PlainWeightPageSource()
        self.weight_buffer = self.weight_source.allocate_weights(
            self.owner, self.weight_layout.total_bytes, str(self.device)
        )
        if load_weights:
            load_checkpoint(self.model_dir, self.weight_layout, self.weight_buffer)
        rope = RotaryEmbedding(mc, self._max_model_len, self.dtype, self.device)
        self.model = CausalLM(mc, self.weight_layout.bind(self.weight_buffer), rope)

        # KV: pages from the source, blocks from the pages.
        kv_layout = KVBlockLayout(mc.num_hidden_layers, mc.num_key_value_heads, mc.head_dim, cfg.block_size, self.dtype)
        kv_bytes = cfg.resolved_kv_cache_bytes(self.device.type)
        if kv_source is None:
            kv_source = PlainKVPageSource(-(-kv_bytes // cfg.page_size_bytes), cfg.page_size_bytes)
        max_num_pages = max(1, -(-kv_bytes // kv_source.page_size_bytes))
        self.kv_cache = PagedKVCache(kv_source, self.owner, kv_layout, max_num_pages, self.device)
        self.block_manager = BlockManager(
            block_size=cfg.block_size,
            blocks_per_page=self.kv_cache.blocks_per_page,
            max_num_pages=max_num_pages,
            acquire_pages=self.kv_cache.acquire_pages,
            release_pages=self.kv_cache.release_pages,
            num_free_pages_cached=cfg.num_free_pages_cached,
            enable_prefix_caching=cfg.enable_prefix_caching,
        )
        null_block = self.block_manager.allocate([], 1)
        if not null_block:
            raise RuntimeError("the KV page source has no page for this engine")
        usable_tokens = (self.block_manager.max_num_blocks - 1) * cfg.block_size
        if usable_tokens < 2:
            raise ValueError("kv_cache_bytes is too small for even one request")
        # A request must always fit alone, or preemption could never make room for it.
        self._max_model_len = min(self._max_model_len, usable_tokens)

        self.scheduler = Scheduler(
            self.block_manager, max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens
        )
        self.runner = ModelRunner(self.model, self.kv_cache, null_block_id=null_block[0], device=self.device)
        self.sampler = Sampler(self.device, cfg.seed, self._eos_token_ids)
        self.sampler.grammars = GrammarBook(self._tokenizer, mc.vocab_size, sorted(self._eos_token_ids))
        self.metrics = EngineMetrics(cfg.stats_window_s)
        self.cuda_graph_error: str | None = None  # why decode runs eagerly on CUDA, if it does
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # weights and zeroed pages were written on the default stream
        if self.device.type == "cuda" and cfg.use_cuda_graphs:
            from .cuda_graphs import CudaGraphRunner

            try:
                self.runner.graphs = CudaGraphRunner(
                    self.runner, max_batch_size=min(cfg.cuda_graph_max_batch_size, cfg.max_num_seqs),
                    max_model_len=self._max_model_len, stream=self._stream,
                )
            except RuntimeError as exc:  # a capture the driver refuses must not take the model down: run eagerly
                self.cuda_graph_error = f"{type(exc).__name__}: {exc}"
                warnings.warn(f"{self.model_name}: CUDA graph capture failed, decoding eagerly ({exc})", stacklevel=2)

        self._lock = threading.RLock()
        self._inbox: deque[tuple] = deque()
        self._ids_lock = threading.Lock()
        self._live_ids: set[str] = set()
        self._seqs: dict[str, Sequence] = {}
        self._streams: dict[str, _TextStream] = {}
        self._held: dict[str, Sequence] = {}  # P/D: finished prefills keeping their blocks for transfer
        self._reserved: dict[str, list[int]] = {}  # P/D: blocks reserved for a decode another instance prefills
        self._groups: dict[str, list[Sequence]] = {}  # n > 1: the client's request id -> its live samples
        self.num_prefill_tokens_computed = 0  # since start: prompt tokens (and recomputed ones) run through the model
        self.last_logits: dict[str, torch.Tensor] = {}  # filled when config.keep_logits
        self.num_preemptions = 0
        self.last_step: StepRecord | None = None
        # The canary a restored or forked copy must reproduce: taken from the checkpoint just read, or handed in
        # (e.g. the source replica's) when the weights come later; None until `record_reference_canary`.
        self.reference_canary: CanaryResult | None = self.canary() if load_weights else reference_canary

    # ---- properties ---------------------------------------------------------------------------------------
    @property
    def tokenizer(self) -> TextTokenizer:
        return self._tokenizer

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    @property
    def model_name(self) -> str:
        return self.model_dir.name

    # ---- requests (any thread) ----------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: Seq[int], sampling: SamplingParams) -> None:
        """Queue a request. Raises ValueError at once for bad input: an empty or too long prompt (it must leave
        room for one output token within `max_model_len`), an id outside the vocabulary, a duplicate live id."""
        seq = self._new_sequence(request_id, prompt_token_ids, sampling)
        self._inbox.append(("add", seq))

    def abort(self, request_id: str) -> None:
        """Stop a request wherever it is; its last output says finish_reason "abort". Unknown ids are ignored."""
        self._inbox.append(("abort", request_id))

    def has_unfinished(self) -> bool:
        return bool(self._inbox) or self.scheduler.has_work()

    # ---- the loop (engine thread) -------------------------------------------------------------------------
    def step(self) -> list[EngineOutput]:
        """Run one scheduling step: admit queued requests, run one forward pass over the batch, sample, and
        return each affected request's new tokens and text."""
        with self._lock:
            now = time.monotonic()
            outputs = self._drain_inbox(now)
            batch = self.scheduler.schedule()
            self.num_preemptions += len(batch.preempted)
        if batch.is_empty:
            self.last_step = StepRecord(0, 0, 0, 0.0)  # a step that computed nothing says so (profilers read it)
            return outputs
        started = time.monotonic()
        with torch.inference_mode(), self._stream_context():
            sample_indices, logits = self.runner.execute(batch.seqs, batch.num_new_tokens)
            tokens, logprobs, top = [], None, None
            sampled = [batch.seqs[i] for i in sample_indices]
            if sampled:
                with self._lock:  # forks change the scheduler's and the block manager's state
                    sampled, logits = self._fork_pending(sampled, logits)
                result = self.sampler.sample(
                    logits, [s.request_id for s in sampled], [s.sampling for s in sampled], sampled
                )
                tokens, logprobs, top = result.token_ids, result.logprobs, result.top_logprobs
        finished_s = time.monotonic()
        with self._lock:
            num_prefill = num_decode = 0
            for seq, num_new in zip(batch.seqs, batch.num_new_tokens):
                is_decode = num_new == 1 and seq.num_output_tokens > 0 and seq.num_uncomputed_tokens == 1
                num_decode += num_new if is_decode else 0
                num_prefill += 0 if is_decode else num_new
                seq.num_computed_tokens += num_new
                if seq.is_prefix_cacheable:
                    self.block_manager.cache_computed_blocks(seq)
            self.num_prefill_tokens_computed += num_prefill
            for k, seq in enumerate(sampled):
                if self.config.keep_logits:
                    self.last_logits[seq.request_id] = logits[k].detach().cpu()
                try:
                    outputs.append(self._on_token(seq, tokens[k], logprobs[k] if logprobs else None, finished_s,
                                                  top[k] if top else None))
                except Exception as exc:  # noqa: BLE001 - one request's detokenising or stop matching: it alone ends
                    outputs.append(self._fail_request(seq, exc))
            self.metrics.record_step(finished_s, finished_s - started, num_prefill, num_decode)
            self.last_step = StepRecord(num_prefill, num_decode, len(batch.seqs), finished_s - started)
        return outputs

    def drop_prefix_cache(self) -> None:
        """Forget every cached prefix block (they become plain free blocks): their KV is about to be lost or was
        (the pages slept, new weights). Blocks of live requests keep their KV; only its reuse by others ends."""
        with self._lock:
            self.block_manager.drop_cached_blocks()

    def stats(self) -> EngineStats:
        with self._lock:
            now = time.monotonic()
            prefill_tps, decode_tps = self.metrics.tokens_per_s(now)
            num_pending = sum(1 for kind, *_ in list(self._inbox) if kind in ("add", "add_decode"))
            return EngineStats(
                num_waiting=len(self.scheduler.waiting) + num_pending,
                num_running=len(self.scheduler.running),
                num_kv_blocks_used=self.block_manager.num_used_blocks - 1,  # not the padding block
                num_kv_blocks_free=self.block_manager.num_free_blocks,
                ttft_ms_p50=self.metrics.ttft_ms_p50(now),
                tpot_ms_p50=self.metrics.tpot_ms_p50(now),
                prefill_tokens_per_s=prefill_tps,
                decode_tokens_per_s=decode_tps,
                num_held_prefills=len(self._held),
                num_preemptions=self.num_preemptions,
                prefix_cache_queries=self.block_manager.num_prefix_cache_queries,
                prefix_cache_hits=self.block_manager.num_prefix_cache_hits,
                num_kv_blocks_cached=self.block_manager.num_cached_blocks,
            )

    # ---- internals ----------------------------------------------------------------------------------------
    def _stream_context(self):
        return torch.cuda.stream(self._stream) if self._stream is not None else _NullContext()

    def _validate(self, request_id: str, prompt_token_ids: Seq[int], sampling: SamplingParams) -> list[int]:
        if not isinstance(request_id, str) or not request_id:
            raise ValueError("request_id must be a non-empty string")
        if not isinstance(sampling, SamplingParams):
            raise TypeError("sampling must be a contracts.SamplingParams")
        prompt = [int(t) for t in prompt_token_ids]
        if not prompt:
            raise ValueError("the prompt must have at least one token")
        if len(prompt) >= self._max_model_len:
            raise ValueError(
                f"prompt of {len(prompt)} tokens leaves no room to generate within max_model_len {self._max_model_len}"
            )
        vocab = self.model_config.vocab_size
        if min(prompt) < 0 or max(prompt) >= vocab:
            raise ValueError(f"prompt token ids must lie in [0, {vocab})")
        _check_sampling(sampling, vocab)
        if sampling.guided is not None:
            self.sampler.grammars.compile(sampling.guided)  # a schema that cannot compile fails here, at add
        return prompt

    def _claim_id(self, request_id: str) -> None:
        with self._ids_lock:
            if request_id in self._live_ids:
                raise ValueError(f"request {request_id!r} is already in the engine")
            self._live_ids.add(request_id)

    def _new_sequence(
        self, request_id: str, prompt_token_ids: Seq[int], sampling: SamplingParams, *, is_prefill_only: bool = False
    ) -> Sequence:
        prompt = self._validate(request_id, prompt_token_ids, sampling)
        self._claim_id(request_id)
        return Sequence(request_id=request_id, token_ids=prompt, num_prompt_tokens=len(prompt), sampling=sampling,
                        arrival_s=time.monotonic(), is_prefill_only=is_prefill_only)

    def _register(self, seq: Sequence) -> None:
        self._seqs[seq.request_id] = seq
        context = seq.token_ids[: seq.num_prompt_tokens]
        self._streams[seq.request_id] = _TextStream(
            IncrementalDetokenizer(self._tokenizer, context_token_ids=context[-8:]),
            StopStringMatcher(seq.sampling.stop),
        )
        self.sampler.add_request(seq.request_id, seq.sampling, self.model_config.vocab_size,
                                 num_drawn_elsewhere=seq.num_inherited_output_tokens)
        if seq.sampling.guided is not None:
            self.sampler.grammars.add(seq.request_id, seq.sampling.guided, seq.token_ids[seq.num_prompt_tokens:])

    def _drain_inbox(self, now: float) -> list[EngineOutput]:
        outputs: list[EngineOutput] = []
        while self._inbox:
            kind, *args = self._inbox.popleft()
            if kind == "add":
                (seq,) = args
                try:
                    self._register(seq)
                    if seq.sampling.n > 1:
                        seq.num_forks_pending = seq.sampling.n - 1
                        self._groups[seq.request_id] = [seq]
                except Exception as exc:  # noqa: BLE001 - this request's own setup failed: it alone ends
                    outputs.append(self._fail_request(seq, exc))
                    continue
                self.scheduler.add(seq)
            elif kind == "add_decode":
                try:
                    outputs.extend(self._admit_decode(*args))
                except Exception as exc:  # noqa: BLE001 - a handed-over request's own setup failed: it alone ends
                    outputs.append(self._fail_request(args[0], exc))
            elif kind == "abort":
                outputs.extend(self._abort_now(args[0]))
            elif kind == "detach":
                outputs.extend(self._detach_now(*args))
            elif kind == "reattach":
                outputs.extend(self._reattach_now(args[0]))
        return outputs

    def _abort_now(self, request_id: str) -> list[EngineOutput]:
        group = self._groups.get(request_id)
        seq = self._seqs.get(request_id) or self._held.get(request_id) or (group[0] if group else None)
        if seq is None:
            blocks = self._reserved.pop(request_id, None)
            if blocks:
                self.block_manager.free(blocks)
            return []
        self._end_group(seq)
        self._finish(seq)
        return [self._output(seq, (), "", None, "abort")]

    def _finish(self, seq: Sequence) -> None:
        """Take a request out of the engine and give its blocks back."""
        if seq.status in (SequenceStatus.RUNNING, SequenceStatus.WAITING):
            self.scheduler.remove(seq)
        self.block_manager.release(seq)
        seq.status = SequenceStatus.FINISHED
        rid = seq.request_id
        self._seqs.pop(rid, None)
        self._held.pop(rid, None)
        self._streams.pop(rid, None)
        self.sampler.remove_request(rid)
        if self._forget_member(seq):
            with self._ids_lock:
                self._live_ids.discard(seq.client_id)

    def _fail_request(self, seq: Sequence, exc: Exception) -> EngineOutput:
        """End one request whose own processing raised; the batch and the engine go on (the forward pass is
        shared, so an error there is the engine's, not a request's, and step() raises it)."""
        self._end_group(seq)
        self._finish(seq)
        return self._output(seq, (), "", None, "error", error=f"{type(exc).__name__}: {exc}")

    def _output(self, seq, token_ids, text, logprobs, finish_reason, **extra) -> EngineOutput:
        return EngineOutput(
            request_id=seq.client_id, token_ids=tuple(token_ids), text=text, logprobs=logprobs,
            is_finished=finish_reason is not None, finish_reason=finish_reason, index=seq.index,
            num_prompt_tokens=seq.num_prompt_tokens, num_output_tokens=seq.num_output_tokens,
            num_cached_tokens=seq.num_cached_prompt_tokens, **extra,
        )

    def _is_stop_token(self, token: int, sampling: SamplingParams) -> bool:
        return token in sampling.stop_token_ids or (not sampling.ignore_eos and token in self._eos_token_ids)

    def _on_token(self, seq: Sequence, token: int, logprob: float | None, now: float,
                  top: tuple[tuple[int, float], ...] | None = None) -> EngineOutput:
        sp = seq.sampling
        seq.token_ids.append(token)
        if seq.first_token_s is None:
            seq.first_token_s = now
            self.metrics.record_ttft(now, (now - seq.arrival_s) * 1000.0)
        seq.last_token_s = now
        stream = self._streams[seq.request_id]
        finish_reason = None
        text = ""
        if self._is_stop_token(token, sp):
            finish_reason = "stop"  # the stop token is reported, its text is not
        else:
            text = stream.stop.push(stream.detokenizer.feed([token]))
            if stream.stop.is_stopped:
                finish_reason = "stop"
        if finish_reason is None and (seq.num_output_tokens >= sp.max_tokens or seq.num_tokens >= self._max_model_len):
            finish_reason = "length"
        if finish_reason is not None and not stream.stop.is_stopped:
            text += stream.stop.push(stream.detokenizer.flush())
            text += stream.stop.flush()
            if stream.stop.is_stopped:
                finish_reason = "stop"
        logprobs = (logprob,) if sp.logprobs and logprob is not None else None
        extra = {"top_logprobs": (top,)} if sp.logprobs and sp.top_logprobs and top is not None else {}
        if finish_reason is not None:
            self._record_tpot(seq, now)
            request_finish = self._group_end(seq, finish_reason)
            self._finish(seq)
            return self._output(seq, (token,), text, logprobs, request_finish, choice_finish_reason=finish_reason,
                                **extra)
        if seq.is_prefill_only:
            return self._hold(seq, token, text, logprobs, **extra)
        return self._output(seq, (token,), text, logprobs, None, **extra)

    def _record_tpot(self, seq: Sequence, now: float) -> None:
        num_sampled = seq.num_output_tokens - seq.num_inherited_output_tokens
        if num_sampled > 1 and seq.first_token_s is not None:
            self.metrics.record_tpot(now, (now - seq.first_token_s) * 1000.0 / (num_sampled - 1))

    @property
    def kv_block_num_bytes(self) -> int:
        """Bytes of one KV block (all layers, K and V): the unit of P/D transfer."""
        return self.kv_cache.block_num_bytes


def _check_sampling(sampling: SamplingParams, vocab: int) -> None:
    """The gateway refuses these with a 400 already; checked again so that a request that skipped it (another
    client of the bus) fails alone at add_request instead of inside step(), where the engine would fail."""
    if sampling.seed is not None and not 0 <= sampling.seed < SEED_LIMIT:
        raise ValueError(f"seed must lie in [0, 2**64), got {sampling.seed}")
    if len(sampling.stop_token_ids) > MAX_STOP_TOKEN_IDS:
        raise ValueError(f"at most {MAX_STOP_TOKEN_IDS} stop token ids")
    if any(not 0 <= t < vocab for t in sampling.stop_token_ids):
        raise ValueError(f"stop token ids must lie in [0, {vocab})")
    if any(len(s) > MAX_STOP_STRING_CHARS for s in sampling.stop):
        raise ValueError(f"a stop string has at most {MAX_STOP_STRING_CHARS} characters")
    if any(not 0 <= t < vocab for t, _ in sampling.logit_bias):
        raise ValueError(f"logit_bias token ids must lie in [0, {vocab})")


class _NullContext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
