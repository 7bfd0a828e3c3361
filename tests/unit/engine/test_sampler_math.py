"""The sampler's per-request parameters do to the distribution what their formulas say (docs/api.md), row by row in
one batched call."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from contracts import SamplingParams
from worker.engine.logits_processors import process_logits
from worker.engine.sampler import Sampler

VOCAB = 12
EOS = 11


@dataclass
class H:
    token_ids: list[int]
    num_prompt_tokens: int


def _params(**kw) -> SamplingParams:
    return SamplingParams(max_tokens=kw.pop("max_tokens", 8), **kw)


def _logits(rows: int = 1, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed))


def test_frequency_and_presence_subtract_over_the_output_only():
    logits = _logits()
    history = H([3, 4, 3, 3, 5], num_prompt_tokens=2)  # prompt 3, 4; output 3, 3, 5
    out = process_logits(logits, [_params(frequency_penalty=0.5, presence_penalty=0.25)], [history], frozenset())
    expected = logits.clone()
    expected[0, 3] -= 0.5 * 2 + 0.25
    expected[0, 5] -= 0.5 * 1 + 0.25  # token 4 is only in the prompt: OpenAI's penalties leave it alone
    torch.testing.assert_close(out, expected)


def test_repetition_divides_positive_and_multiplies_negative_logits_seen_in_prompt_or_output():
    logits = torch.zeros(1, VOCAB)
    logits[0, 1], logits[0, 2], logits[0, 6] = 2.0, -2.0, 3.0
    out = process_logits(logits, [_params(repetition_penalty=2.0)], [H([1, 2], num_prompt_tokens=1)], frozenset())
    assert out[0, 1] == 1.0 and out[0, 2] == -4.0 and out[0, 6] == 3.0  # 6 was never seen


def test_logit_bias_adds_to_the_logit_and_can_force_or_ban_a_token():
    logits = _logits()
    top = int(logits.argmax())
    params = _params(logit_bias=((top, -100.0), (7, 1.5)))
    out = process_logits(logits, [params], [H([0], 1)], frozenset())
    assert out[0, top] == logits[0, top] - 100 and out[0, 7] == logits[0, 7] + 1.5
    forced = Sampler(torch.device("cpu")).sample(logits, ["r"], [_params(temperature=0, logit_bias=((7, 100.0),))],
                                                 [H([0], 1)])
    assert forced.token_ids == [7]


def test_min_tokens_masks_eos_and_stop_ids_until_enough_output():
    logits = torch.zeros(1, VOCAB)
    logits[0, EOS], logits[0, 9], logits[0, 4] = 5.0, 4.0, 1.0
    params = _params(temperature=0, min_tokens=2, stop_token_ids=(9,))
    sampler = Sampler(torch.device("cpu"), eos_token_ids=frozenset({EOS}))
    assert sampler.sample(logits, ["r"], [params], [H([0, 4], 1)]).token_ids == [4]  # 1 output: EOS, 9 masked
    assert sampler.sample(logits, ["r"], [params], [H([0, 4, 4], 1)]).token_ids == [EOS]  # 2 outputs: free
    ignoring = _params(temperature=0, min_tokens=2, ignore_eos=True)  # EOS is no stop then: not masked (vLLM)
    assert sampler.sample(logits, ["r"], [ignoring], [H([0], 1)]).token_ids == [EOS]


def test_min_p_drops_tokens_below_its_share_of_the_top_probability():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.1, 0.06, 0.04] + [1e-9] * (VOCAB - 5)]))
    probs = Sampler._probabilities(logits, [_params(min_p=0.25)])  # keeps p >= 0.125
    assert (probs[0, :2] > 0).all() and (probs[0, 2:] == 0).all()
    torch.testing.assert_close(probs[0, :2], torch.tensor([0.625, 0.375]))


def test_rows_of_one_batch_get_their_own_parameters():
    logits = _logits(3, seed=1)
    params = [_params(frequency_penalty=1.0), _params(), _params(repetition_penalty=1.5, logit_bias=((2, 3.0),))]
    histories = [H([1, 2, 2], 1), H([5, 5], 1), H([4, 6], 1)]
    batched = process_logits(logits, params, histories, frozenset())
    for i in range(3):
        alone = process_logits(logits[i:i + 1], [params[i]], [histories[i]], frozenset())
        torch.testing.assert_close(batched[i:i + 1], alone)
    torch.testing.assert_close(batched[1], logits[1])  # a row without parameters is untouched


@pytest.mark.parametrize("k", [1, 5, VOCAB])
def test_top_logprobs_are_the_most_likely_tokens_of_the_raw_distribution(k):
    logits = _logits(2, seed=2)
    params = [_params(temperature=0, logprobs=True, top_logprobs=k, frequency_penalty=2.0),
              _params(temperature=0, logprobs=True)]
    result = Sampler(torch.device("cpu")).sample(logits, ["a", "b"], params, [H([0, 3], 1), H([0], 1)])
    log_probs = torch.log_softmax(logits, dim=-1)
    ids = [t for t, _ in result.top_logprobs[0]]
    assert ids == log_probs[0].argsort(descending=True)[:k].tolist()
    assert [lp for _, lp in result.top_logprobs[0]] == pytest.approx(log_probs[0, ids].tolist())
    assert result.top_logprobs[1] == ()  # the second row asked for none
    assert result.logprobs[0] == pytest.approx(float(log_probs[0, result.token_ids[0]]))
