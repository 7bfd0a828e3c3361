"""Engine throughput beside Hugging Face `generate()` on the same checkpoint, in the same run.

    .venv/bin/python bench/engine.py                                  # CPU, demo-small, float32
    .venv/bin/python bench/engine.py --device cuda --shape qwen2-0.5b # H200 variant, bfloat16

Decode tokens/s at batch B: B requests of `--prompt-len` tokens generate `--decode-tokens` tokens each; the rate
is B / the median duration of one decode step (ours: one `engine.step()` once every request has its first token;
Hugging Face: the interval between two tokens of `generate()`, timed by a stopping-criteria hook), the median over
all steps of `--repeats` interleaved runs: robust on a shared machine where a whole-run time swings with the load.
Prefill tokens/s: B * prompt_len over the time to every first token (ours) or to generate()'s first token, best
of the runs. Both sides run greedy, ignore EOS, same prompts, same threads and dtype, after a warm-up.

    .venv/bin/python bench/engine.py --chat-replay                    # prefix caching on / off, same run

Multi-turn chat replay: `--conversations` chats with one shared system prompt, `--turns` turns each; a turn's
prompt is the whole history (system, earlier questions, the engine's own replies) plus a new question, as a chat
client resends it. Each turn's requests of all chats are submitted together, first to an engine with prefix
caching, then to one without (interleaved, so both see the same machine load). Reported: TTFT (add_request to
the first token) p50 and p90 over all requests, prompt tokens computed, the cache's hit rate, and whether the
greedy replies are identical.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

from contracts.requests import SamplingParams  # noqa: E402
from worker.engine import EngineConfig, LLMEngine, make_demo_models  # noqa: E402

from transformers import StoppingCriteria, StoppingCriteriaList  # noqa: E402  (the baseline peer)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


# The clock both sides are timed with: wall time, or this thread's CPU time (set by --clock). On a CPU shared with
# other jobs, CPU time leaves out the time the OS gave to others; with one torch thread it is the work done.
_now = time.perf_counter


def _prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, vocab, (batch, length), generator=g).tolist()


def run_ours(engine: LLMEngine, prompts: list[list[int]], num_decode: int, device: str) -> tuple[float, list[float]]:
    """(prefill seconds: to every request's first token, seconds of each decode step)."""
    params = SamplingParams(max_tokens=num_decode, temperature=0, ignore_eos=True)
    _sync(device)
    start = _now()
    for i, prompt in enumerate(prompts):
        engine.add_request(f"bench-{time.monotonic_ns()}-{i}", prompt, params)
    num_first, first_done = 0, None
    step_s: list[float] = []
    while engine.has_unfinished():
        step_start = _now()
        outputs = engine.step()
        _sync(device)
        if first_done is not None:
            step_s.append(_now() - step_start)
        num_first += sum(1 for out in outputs if out.num_output_tokens == 1)
        if first_done is None and num_first == len(prompts):
            first_done = _now()
    return first_done - start, step_s


class _StepClock(StoppingCriteria):
    """Called by generate() once per generated token: timestamps give HF's per-step durations."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.stamps: list[float] = []

    def __call__(self, input_ids, scores, **kwargs):
        _sync(self.device)
        self.stamps.append(_now())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def run_hf(model, prompts: list[list[int]], num_decode: int, device: str) -> tuple[float, list[float]]:
    """(prefill seconds: to generate()'s first token, seconds of each decode step)."""
    ids = torch.tensor(prompts, device=device)
    mask = torch.ones_like(ids)
    clock = _StepClock(device)
    _sync(device)
    start = _now()
    with torch.inference_mode():
        model.generate(ids, attention_mask=mask, max_new_tokens=num_decode, min_new_tokens=num_decode,
                       do_sample=False, pad_token_id=0, stopping_criteria=StoppingCriteriaList([clock]))
    prefill_s = clock.stamps[0] - start
    return prefill_s, [b - a for a, b in zip(clock.stamps, clock.stamps[1:])]


_SYSTEM_PROMPT = ("You are a careful assistant for a small team. Answer in short sentences, cite the numbers you are "
                  "given, say when you do not know, and never invent a source. Keep code in fenced blocks.")


def _chat_turn(engine: LLMEngine, prompts: dict[int, list[int]], num_reply: int, tag: str
               ) -> tuple[dict[int, list[int]], list[float]]:
    """Submit one turn of every chat at once; (the replies' tokens, each request's TTFT in seconds)."""
    params = SamplingParams(max_tokens=num_reply, temperature=0, ignore_eos=True)
    chat_of = {f"{tag}-{c}": c for c in prompts}
    submitted_s = {}
    for rid, c in chat_of.items():
        submitted_s[rid] = _now()
        engine.add_request(rid, prompts[c], params)
    replies: dict[int, list[int]] = {c: [] for c in prompts}
    ttft_s: list[float] = []
    while engine.has_unfinished():
        outputs = engine.step()  # tokens reach the host inside step(): no device sync needed
        now = _now()
        for out in outputs:
            reply = replies[chat_of[out.request_id]]
            if out.token_ids and not reply:
                ttft_s.append(now - submitted_s[out.request_id])
            reply.extend(out.token_ids)
    return replies, ttft_s


def _p90(values: list[float]) -> float:
    return sorted(values)[max(0, -(-9 * len(values) // 10) - 1)]


def run_chat_replay(model_dir: Path, num_chats: int, num_turns: int, num_reply: int, device: str,
                    dtype: torch.dtype) -> None:
    engines = {enabled: LLMEngine(model_dir, device=device, dtype=dtype,
                                  config=EngineConfig(enable_prefix_caching=enabled))
               for enabled in (True, False)}
    tok = engines[True].tokenizer
    first_turn = [tok.encode(tok.apply_chat_template([
        {"role": "system", "content": _SYSTEM_PROMPT},
        {"role": "user", "content": f"Chat {c}: summarise the numbers 3, 14, 15 and 92 for me."}]))
        for c in range(num_chats)]
    histories = {enabled: {c: list(first_turn[c]) for c in range(num_chats)} for enabled in engines}
    ttft_s: dict[bool, list[float]] = {True: [], False: []}
    is_identical = True
    for turn in range(num_turns):
        replies = {}
        for enabled, engine in engines.items():  # interleaved: both sides see the same machine load
            replies[enabled], ttfts = _chat_turn(engine, histories[enabled], num_reply, f"t{turn}")
            ttft_s[enabled].extend(ttfts)
        is_identical &= replies[True] == replies[False]
        for enabled in engines:
            for c, history in histories[enabled].items():
                question = (f"<|im_end|>\n<|im_start|>user\nTurn {turn}: what follows from reply {c}?<|im_end|>\n"
                            "<|im_start|>assistant\n")
                history.extend(replies[enabled][c] + tok.encode(question))
    clock = "cpu" if _now is time.thread_time else "wall"
    print(f"# python bench/engine.py {' '.join(sys.argv[1:])}")
    print(f"# model {model_dir.name}, {num_chats} chats x {num_turns} turns, {num_reply}-token replies, block_size "
          f"{engines[True].config.block_size}, {dtype}, device {device}, {clock} clock, torch {torch.__version__}; "
          f"greedy replies identical with and without: {is_identical}")
    print(f"{'prefix caching':>14} | {'TTFT p50 ms':>11} | {'TTFT p90 ms':>11} | {'prompt tokens computed':>22} | "
          f"{'hit rate':>8}")
    for enabled, engine in engines.items():
        stats = engine.stats()
        rate = "-" if stats.prefix_cache_hit_rate is None else f"{stats.prefix_cache_hit_rate:.1%}"
        print(f"{'on' if enabled else 'off':>14} | {statistics.median(ttft_s[enabled]) * 1e3:>11.1f} | "
              f"{_p90(ttft_s[enabled]) * 1e3:>11.1f} | {engine.num_prefill_tokens_computed:>22} | {rate:>8}")
    computed_on, computed_off = (engines[e].num_prefill_tokens_computed for e in (True, False))
    ttft_ratio = statistics.median(ttft_s[False]) / statistics.median(ttft_s[True])
    print(f"# off / on: prompt tokens computed {computed_off / computed_on:.2f}x, TTFT p50 {ttft_ratio:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--shape", default=None, help="demo model name (default: demo-small on CPU, "
                                                       "qwen2-0.5b on CUDA)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--prompt-len", type=int, default=None, help="default: 64 on CPU, 512 on CUDA")
    parser.add_argument("--decode-tokens", type=int, default=None, help="default: 32 on CPU, 128 on CUDA")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (both sides)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="cpu: this thread's CPU time (CPU device with --threads 1 only)")
    parser.add_argument("--models-dir", default=str(REPO_ROOT / ".janus" / "models"))
    parser.add_argument("--chat-replay", action="store_true",
                        help="multi-turn chat replay with and without prefix caching (no transformers baseline)")
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--reply-tokens", type=int, default=16)
    args = parser.parse_args()

    is_cuda = args.device == "cuda"
    if args.clock == "cpu":
        if is_cuda or args.threads != 1:
            parser.error("--clock cpu needs --device cpu and --threads 1")
        global _now
        _now = time.thread_time
    shape = args.shape or ("qwen2-0.5b" if is_cuda else "demo-small")
    prompt_len = args.prompt_len or (512 if is_cuda else 64)
    num_decode = args.decode_tokens or (128 if is_cuda else 32)
    dtype = torch.bfloat16 if is_cuda else torch.float32
    torch.set_num_threads(args.threads)
    model_dir = make_demo_models(args.models_dir, [shape])[shape]
    if args.chat_replay:
        run_chat_replay(model_dir, args.conversations, args.turns, args.reply_tokens, args.device, dtype)
        return

    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(args.device).eval()
    max_batch = max(args.batch_sizes)
    engine = LLMEngine(
        model_dir, device=args.device, dtype=dtype,
        config=EngineConfig(max_num_seqs=max(max_batch, 1), max_num_batched_tokens=max(2048, prompt_len * max_batch),
                            max_model_len=prompt_len + num_decode + 16, cuda_graph_max_batch_size=max_batch),
    )
    vocab = engine.tokenizer.vocab_size

    rows = []
    for batch in args.batch_sizes:
        prompts = _prompts(batch, prompt_len, vocab, seed=batch)
        run_ours(engine, prompts, 4, args.device)  # warm-up (and CUDA graph capture on first use)
        run_hf(hf, prompts, 4, args.device)
        ours, theirs = [], []
        for _ in range(args.repeats):  # interleaved, so both sides see the same machine load
            ours.append(run_ours(engine, prompts, num_decode, args.device))
            theirs.append(run_hf(hf, prompts, num_decode, args.device))
        num_prompt_tokens = batch * prompt_len
        rows.append((batch,
                     num_prompt_tokens / min(o[0] for o in ours), num_prompt_tokens / min(t[0] for t in theirs),
                     batch / statistics.median(x for o in ours for x in o[1]),
                     batch / statistics.median(x for t in theirs for x in t[1])))

    command = "python bench/engine.py " + " ".join(sys.argv[1:])
    print(f"# {command}")
    print(f"# model {shape} ({engine.model_config.num_hidden_layers} layers, hidden {engine.model_config.hidden_size}),"
          f" {dtype}, device {args.device}, prompt {prompt_len} tokens, {num_decode} decoded tokens, "
          f"threads {args.threads}, {args.clock} clock, torch {torch.__version__}, {args.repeats} interleaved runs")
    if is_cuda:
        graphs = "off: " + engine.cuda_graph_error if engine.cuda_graph_error else (
            "on" if engine.runner.graphs is not None else "off")
        print(f"# {torch.cuda.get_device_name()}, CUDA graphs {graphs}")
    print(f"{'batch':>5} | {'decode tok/s':>12} | {'HF decode':>10} | {'ratio':>6} | {'prefill tok/s':>13} | "
          f"{'HF prefill':>10} | {'ratio':>6}")
    for batch, pre, hf_pre, dec, hf_dec in rows:
        print(f"{batch:>5} | {dec:>12.1f} | {hf_dec:>10.1f} | {dec / hf_dec:>5.2f}x | {pre:>13.1f} | {hf_pre:>10.1f} | "
              f"{pre / hf_pre:>5.2f}x")
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown of large models


if __name__ == "__main__":
    main()
