"""Engine throughput beside Hugging Face `generate()` on the same checkpoint, in the same run.

    .venv/bin/python bench/engine.py                                  # CPU, demo-small, float32
    .venv/bin/python bench/engine.py --device cuda --shape qwen2-0.5b # H200 variant, bfloat16

Decode tokens/s at batch B: B requests of `--prompt-len` tokens generate `--decode-tokens` tokens each; the rate
is B / the median duration of one decode step (ours: one `engine.step()` once every request has its first token;
Hugging Face: the interval between two tokens of `generate()`, timed by a stopping-criteria hook), the median over
all steps of `--repeats` interleaved runs: robust on a shared machine where a whole-run time swings with the load.
Prefill tokens/s: B * prompt_len over the time to every first token (ours) or to generate()'s first token, best
of the runs. Both sides run greedy, ignore EOS, same prompts, same threads and dtype, after a warm-up.
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
