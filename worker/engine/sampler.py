"""Token choice for a batch of requests: the request's logits processors (min_tokens, logit_bias, penalties:
logits_processors.py), then greedy, or temperature, min-p, top-k, top-p and a draw; per-request seeds; the
log-probability of each chosen token and, when asked, the top alternatives.

A request with a seed draws from its own generator, so its output does not depend on what else shares the batch;
requests without one share the engine's generator. Log-probabilities are those of the model's distribution
(raw logits, before temperature and truncation), as the OpenAI API reports them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from contracts.requests import SamplingParams

from .grammar import GrammarBook
from .logits_processors import History, process_logits

TopLogprobs = tuple[tuple[int, float], ...]  # (token id, log-probability), most likely first


@dataclass(frozen=True)
class SampleResult:
    token_ids: list[int]
    logprobs: list[float] | None  # of each chosen token; None when no row asked
    top_logprobs: list[TopLogprobs] | None  # each row's `top_logprobs` alternatives; None when no row asked


class Sampler:
    def __init__(self, device: torch.device, seed: int = 0, eos_token_ids: frozenset[int] = frozenset()) -> None:
        self.device = device
        self.eos_token_ids = eos_token_ids
        self._shared_generator = torch.Generator(device=device)
        self._shared_generator.manual_seed(seed)
        self._generators: dict[str, torch.Generator] = {}
        self.grammars: GrammarBook | None = None  # set by the engine: structured outputs (grammar.py)

    def add_request(self, request_id: str, sampling: SamplingParams, vocab_size: int = 0,
                    num_drawn_elsewhere: int = 0) -> None:
        """Give a seeded request its own generator. `num_drawn_elsewhere`: tokens of this request another instance
        already sampled from the same seed (P/D: the prefill instance's first token); the generator is advanced past
        those draws, so the stream continues exactly as on a single instance. Needs `vocab_size` then."""
        if sampling.seed is None or _is_greedy(sampling):
            return
        generator = torch.Generator(device=self.device)
        generator.manual_seed(sampling.seed)
        if num_drawn_elsewhere:
            if vocab_size <= 0:
                raise ValueError("advancing a seeded generator needs the vocabulary size")
            # A draw's consumption of the generator depends only on the row's shape, dtype and device (torch draws
            # one exponential per entry and takes argmax(p / q)), so replaying a draw over a dummy row of the
            # same [vocab] float32 shape leaves the generator exactly where the other instance's draw left its own.
            dummy = torch.ones(vocab_size, dtype=torch.float32, device=self.device)
            for _ in range(num_drawn_elsewhere):
                torch.multinomial(dummy, 1, generator=generator)
        self._generators[request_id] = generator

    def remove_request(self, request_id: str) -> None:
        self._generators.pop(request_id, None)
        if self.grammars is not None:
            self.grammars.remove(request_id)

    def sample(
        self, logits: torch.Tensor, request_ids: Sequence[str], params: Sequence[SamplingParams],
        histories: Sequence[History] | None = None,
    ) -> SampleResult:
        """logits: [N, vocab] float32, one row per request; `histories`: each row's tokens so far (needed by
        min_tokens and the penalties; without them those are not applied)."""
        num_rows = logits.shape[0]
        raw = logits
        if histories is not None:
            logits = process_logits(logits, params, histories, self.eos_token_ids)
        is_guided = self.grammars is not None and any(self.grammars.has(r) for r in request_ids)
        if is_guided:
            logits = self._constrain(logits, raw, request_ids)
        is_greedy = [_is_greedy(p) for p in params]
        tokens = logits.argmax(dim=-1)
        random_rows = [i for i in range(num_rows) if not is_greedy[i]]
        if random_rows:
            probs = self._probabilities(logits[random_rows], [params[i] for i in random_rows])
            shared = [j for j, i in enumerate(random_rows) if request_ids[i] not in self._generators]
            chosen = torch.empty(len(random_rows), dtype=torch.long, device=logits.device)
            if shared:
                chosen[shared] = torch.multinomial(probs[shared], 1, generator=self._shared_generator).squeeze(1)
            for j, i in enumerate(random_rows):
                generator = self._generators.get(request_ids[i])
                if generator is not None:
                    chosen[j] = torch.multinomial(probs[j], 1, generator=generator)[0]
            tokens[random_rows] = chosen
        logprobs = top = None
        if any(p.logprobs for p in params):
            # of the model's own distribution (vLLM's default, raw logprobs): before penalties and truncation
            log_probs = torch.log_softmax(raw, dim=-1)
            logprobs = log_probs.gather(1, tokens[:, None]).squeeze(1).tolist()
            k_max = max(p.top_logprobs for p in params)
            if k_max:
                values, ids = log_probs.topk(min(k_max, raw.shape[-1]), dim=-1)
                values, ids = values.tolist(), ids.tolist()
                top = [tuple(zip(ids[i][: p.top_logprobs], values[i][: p.top_logprobs])) for i, p in enumerate(params)]
        token_ids = tokens.tolist()
        if is_guided:
            self.grammars.accept(request_ids, token_ids)
        return SampleResult(token_ids, logprobs, top)

    def _constrain(self, logits: torch.Tensor, raw: torch.Tensor, request_ids: Sequence[str]) -> torch.Tensor:
        """Each guided row's grammar mask over its processed logits. A row the processors and the grammar leave
        without any token (min_tokens masks EOS where only EOS completes the grammar) takes the grammar's mask over
        the model's raw logits instead: the grammar always wins."""
        assert self.grammars is not None
        x = self.grammars.mask(logits.clone() if logits is raw else logits, request_ids)
        empty = torch.isneginf(x).all(dim=-1).nonzero().flatten().tolist()
        if empty:
            x[empty] = self.grammars.mask(raw[empty].clone(), [request_ids[i] for i in empty])
        return x

    @staticmethod
    def _probabilities(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
        """Temperature, then min-p, top-k, top-p (vLLM's order), then softmax."""
        device = logits.device
        vocab = logits.shape[-1]
        temperatures = torch.tensor([p.temperature for p in params], dtype=logits.dtype, device=device)
        x = logits / temperatures[:, None]
        if any(p.min_p > 0.0 for p in params):
            probs = x.softmax(dim=-1)
            min_p = torch.tensor([p.min_p for p in params], dtype=logits.dtype, device=device)[:, None]
            x = x.masked_fill(probs < min_p * probs.max(dim=-1, keepdim=True).values, float("-inf"))
        top_ks = [p.top_k if 0 < p.top_k < vocab else 0 for p in params]
        if any(top_ks):
            k_max = max(top_ks)
            top_values = x.topk(k_max, dim=-1).values
            k_index = torch.tensor([max(k, 1) - 1 for k in top_ks], device=device)
            thresholds = top_values.gather(1, k_index[:, None])
            has_k = torch.tensor([k > 0 for k in top_ks], device=device)[:, None]
            x = x.masked_fill(has_k & (x < thresholds), float("-inf"))
        top_ps = [p.top_p for p in params]
        if any(p < 1.0 for p in top_ps):
            sorted_x, order = x.sort(dim=-1, descending=True)
            sorted_probs = sorted_x.softmax(dim=-1)
            mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
            top_p = torch.tensor(top_ps, dtype=logits.dtype, device=device)[:, None]
            sorted_x = sorted_x.masked_fill(mass_before > top_p, float("-inf"))  # the top token always stays
            x = torch.empty_like(x).scatter_(1, order, sorted_x)
        return x.softmax(dim=-1)


def _is_greedy(sampling: SamplingParams) -> bool:
    return sampling.temperature == 0.0 or sampling.top_k == 1
