"""Deterministic random-weight Qwen2 checkpoints with a real tokenizer, so several models can be served and tested
without any download (`janus models make-demo`).

Each model folder is a genuine Hugging Face Qwen2 checkpoint: `config.json` (transformers' `Qwen2ForCausalLM` loads
it), `model.safetensors`, `tokenizer.json` (a byte-level BPE trained with `tokenizers` on a built-in text, so any
UTF-8 text round-trips), `tokenizer_config.json` (ChatML chat template) and `generation_config.json`. Everything is
seeded: the same spec writes the same bytes. Torch-free (numpy writes the weights).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# ChatML, with tools as Qwen2.5 renders them (Hermes style): the tool signatures in the system turn, an assistant's
# calls as <tool_call>{"name", "arguments"}</tool_call>, tool results as <tool_response> in a user turn. Without
# tools it renders exactly as plain ChatML (no default system message).
CHATML_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\n\n' }}{%- endif %}"
    "{{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
    "function signatures within <tools></tools> XML tags:\n<tools>' }}"
    "{%- for tool in tools %}{{- '\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' and loop.first %}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\n<tool_response>\n' + message['content'] + '\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}"
    "{%- elif message['role'] == 'assistant' and message['tool_calls'] is defined and message['tool_calls'] %}"
    "{{- '<|im_start|>assistant' }}{%- if message['content'] %}{{- '\n' + message['content'] }}{%- endif %}"
    "{%- for tool_call in message['tool_calls'] %}"
    "{%- if tool_call['function'] is defined %}{%- set tool_call = tool_call['function'] %}{%- endif %}"
    "{{- '\n<tool_call>\n{\"name\": \"' + tool_call['name'] + '\", \"arguments\": ' }}"
    "{{- tool_call['arguments'] | tojson }}{{- '}\n</tool_call>' }}"
    "{%- endfor %}{{- '<|im_end|>\n' }}"
    "{%- else %}{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)
_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json")
_GENERATOR_VERSION = 3  # bump when the bytes written for a spec change (corpus, init), so old folders are redone
_STAMP = "janus_demo.json"  # written last: its presence (with a matching spec) marks a complete folder


@dataclass(frozen=True)
class DemoSpec:
    """The shape of one demo model. `vocab_size` None means: exactly the trained tokenizer's size."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    tokenizer_vocab_size: int
    vocab_size: int | None = None
    max_position_embeddings: int = 4096
    rope_theta: float = 1_000_000.0
    # Untied by default: with tied random embeddings the model mostly repeats its last token.
    tie_word_embeddings: bool = False
    dtype: str = "float32"  # numpy writes float32 or float16 (the loader casts to the engine's dtype)
    seed: int = 0
    is_default: bool = True  # written by `make_demo_models(root)` without names

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


DEMO_MODELS: dict[str, DemoSpec] = {
    # Small enough that an end-to-end test through several processes is quick on a laptop CPU.
    "demo-tiny": DemoSpec(64, 128, 2, 4, 2, tokenizer_vocab_size=1024, seed=1),
    "demo-small": DemoSpec(256, 704, 4, 8, 2, tokenizer_vocab_size=2048, seed=2),
    "demo-medium": DemoSpec(512, 1408, 8, 8, 4, tokenizer_vocab_size=4096, seed=3),
    # The real Qwen2-0.5B shape (494 M parameters) for the GPU benchmark: only written when named.
    "qwen2-0.5b": DemoSpec(
        896, 4864, 24, 14, 2, tokenizer_vocab_size=4096, vocab_size=151936, max_position_embeddings=32768,
        tie_word_embeddings=True, dtype="float16", seed=4, is_default=False,
    ),
}

_BUILTIN_TEXT = """\
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.
Many models share one fleet of devices: stable traffic is packed into a steady pool, bursty traffic gets replicas
in an elastic pool within half a second, and a deadline-aware dispatcher sends each request where it can finish.
Tokens stream back to the client one by one; the first token should arrive quickly, the rest at a steady pace.
def main():\n    for i in range(10):\n        print(f"step {i}: ok")\n    return 0
{"model": "demo", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 16}
Le renard brun rapide saute par-dessus le chien paresseux. Ça coûte très cher, n'est-ce pas ? Où êtes-vous ?
Der schnelle braune Fuchs springt über den faulen Hund. Größe, Übung, Straße, schön, müde.
El rápido zorro marrón salta sobre el perro perezoso. ¿Dónde está la estación? Mañana será otro día.
Быстрая коричневая лиса прыгает через ленивую собаку. Привет, мир! Спасибо большое.
敏捷的棕色狐狸跳过了懒狗。你好，世界！今天天气很好。我们一起学习机器学习。
素早い茶色の狐が怠け者の犬を飛び越える。こんにちは、世界！日本語のテキストです。
빠른 갈색 여우가 게으른 개를 뛰어넘는다. 안녕하세요, 세계!
Emoji: 😀 😃 🚀 🌍 👍 🎉 ❤️ ✨ 🔥 🤖 — symbols: € £ ¥ ° ± × ÷ ≤ ≥ ≠ ∞ π Σ √ → ← ↑ ↓
"""


def _synthetic_sentences(num_sentences: int, seed: int) -> list[str]:
    """Seeded pseudo-words: enough distinct text for a BPE to reach a few thousand merges."""
    rng = np.random.default_rng(seed)
    onsets = ["b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z", "st", "tr", "ch",
              "sh", "pl", "gr", "br", "th"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ou", "ea", "io", "é", "ü"]
    codas = ["", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ng"]
    words = []
    for _ in range(2000):
        num_syllables = int(rng.integers(1, 4))
        words.append("".join(onsets[rng.integers(len(onsets))] + vowels[rng.integers(len(vowels))]
                             + codas[rng.integers(len(codas))] for _ in range(num_syllables)))
    # Zipf-like frequencies, as natural text has: frequent words merge into single tokens first.
    weights = 1.0 / np.arange(1, len(words) + 1)
    weights /= weights.sum()
    lengths = rng.integers(4, 14, size=num_sentences)
    picked = rng.choice(len(words), size=int(lengths.sum()), p=weights)  # one draw: choice(p=...) is slow per call
    endings = rng.choice([".", ".", "!", "?", ","], size=num_sentences)
    sentences, start = [], 0
    for n, ending in zip(lengths.tolist(), endings.tolist()):
        sentence = " ".join(words[i] for i in picked[start : start + n])
        start += n
        sentences.append(sentence[0].upper() + sentence[1:] + ending)
    return sentences


def train_tokenizer(vocab_size: int, seed: int = 0):
    """A byte-level BPE (the GPT-2 / Qwen2 family's kind) trained on the built-in text; deterministic."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = _BUILTIN_TEXT.splitlines() * 4 + _synthetic_sentences(6000, seed)
    tokenizer.train_from_iterator(corpus, trainer)
    return tokenizer


def _spec_digest(name: str, spec: DemoSpec) -> str:
    return hashlib.sha256(json.dumps({"name": name, "version": _GENERATOR_VERSION, **asdict(spec)}, sort_keys=True).encode()).hexdigest()[:16]


def _hf_config(spec: DemoSpec, vocab_size: int, eos_ids: list[int], pad_id: int) -> dict:
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "hidden_act": "silu",
        "max_position_embeddings": spec.max_position_embeddings,
        "max_window_layers": spec.num_hidden_layers,
        "rms_norm_eps": 1e-6,
        "rope_theta": spec.rope_theta,
        "rope_scaling": None,
        "sliding_window": None,
        "use_sliding_window": False,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "vocab_size": vocab_size,
        "bos_token_id": None,
        "eos_token_id": eos_ids[0],
        "pad_token_id": pad_id,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": spec.dtype,
    }


def _random_weights(spec: DemoSpec, vocab_size: int) -> dict[str, np.ndarray]:
    """Scaled so activations stay O(1) through the layers and logits have clear margins (greedy outputs are then
    robust to float rounding, which the parity tests rely on)."""
    dtype = np.dtype(spec.dtype)
    h, i_size, d = spec.hidden_size, spec.intermediate_size, spec.head_dim
    q_out, kv_out = spec.num_attention_heads * d, spec.num_key_value_heads * d
    shapes: list[tuple[str, tuple[int, ...], float]] = [("model.embed_tokens.weight", (vocab_size, h), 1.0)]
    for layer in range(spec.num_hidden_layers):
        p = f"model.layers.{layer}."
        shapes += [
            (p + "input_layernorm.weight", (h,), -1.0),
            (p + "self_attn.q_proj.weight", (q_out, h), h**-0.5),
            (p + "self_attn.q_proj.bias", (q_out,), 0.1),
            (p + "self_attn.k_proj.weight", (kv_out, h), h**-0.5),
            (p + "self_attn.k_proj.bias", (kv_out,), 0.1),
            (p + "self_attn.v_proj.weight", (kv_out, h), h**-0.5),
            (p + "self_attn.v_proj.bias", (kv_out,), 0.1),
            (p + "self_attn.o_proj.weight", (h, q_out), 0.5 * q_out**-0.5),
            (p + "post_attention_layernorm.weight", (h,), -1.0),
            (p + "mlp.gate_proj.weight", (i_size, h), h**-0.5),
            (p + "mlp.up_proj.weight", (i_size, h), h**-0.5),
            (p + "mlp.down_proj.weight", (h, i_size), 0.5 * i_size**-0.5),
        ]
    shapes.append(("model.norm.weight", (h,), -1.0))
    if not spec.tie_word_embeddings:
        shapes.append(("lm_head.weight", (vocab_size, h), 4.0 * h**-0.5))
    rng = np.random.default_rng(spec.seed)
    tensors = {}
    for name, shape, std in shapes:
        if std < 0:  # norm gains: around one, a little spread so they are not a no-op
            tensors[name] = (1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)).astype(dtype)
        else:
            tensors[name] = (std * rng.standard_normal(shape, dtype=np.float32)).astype(dtype)
    return tensors


def write_demo_model(folder: Path, spec: DemoSpec, name: str = "demo") -> None:
    """Write one model of `spec` into an existing empty folder (no completeness stamp; see make_demo_models)."""
    from safetensors.numpy import save_file

    tokenizer = train_tokenizer(spec.tokenizer_vocab_size, seed=spec.seed)
    tok_vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    vocab_size = spec.vocab_size or tok_vocab
    if vocab_size < tok_vocab:
        raise ValueError(f"{name}: vocab_size {vocab_size} is smaller than the tokenizer's {tok_vocab}")
    endoftext, im_end = tokenizer.token_to_id("<|endoftext|>"), tokenizer.token_to_id("<|im_end|>")
    tokenizer.save(str(folder / "tokenizer.json"))
    added = {str(tokenizer.token_to_id(t)): {"content": t, "special": True, "lstrip": False, "rstrip": False,
                                              "normalized": False, "single_word": False} for t in SPECIAL_TOKENS}
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": spec.max_position_embeddings,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHATML_TEMPLATE,
    }
    eos_ids = [im_end, endoftext]
    gen_config = {"eos_token_id": eos_ids, "pad_token_id": endoftext, "do_sample": False, "bos_token_id": None}
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2, ensure_ascii=False))
    (folder / "generation_config.json").write_text(json.dumps(gen_config, indent=2))
    (folder / "config.json").write_text(json.dumps(_hf_config(spec, vocab_size, eos_ids, endoftext), indent=2))
    save_file(_random_weights(spec, vocab_size), str(folder / "model.safetensors"), metadata={"format": "pt"})


def is_complete(folder: Path, name: str, spec: DemoSpec) -> bool:
    """True when `folder` holds every file of this exact spec (the stamp is written last)."""
    stamp = folder / _STAMP
    if not stamp.is_file() or not all((folder / f).is_file() for f in _FILES):
        return False
    try:
        return json.loads(stamp.read_text()).get("digest") == _spec_digest(name, spec)
    except (OSError, ValueError):
        return False


def make_demo_models(root: str | Path, names: Iterable[str] | None = None) -> dict[str, Path]:
    """Write `<root>/<name>/` for each named demo model (default: every spec with `is_default`), skipping folders
    already complete for the same spec. Safe against concurrent callers: each model is built in a temporary folder
    and renamed into place. Returns name -> folder."""
    root = Path(root)
    selected = [n for n, s in DEMO_MODELS.items() if s.is_default] if names is None else list(names)
    unknown = [n for n in selected if n not in DEMO_MODELS]
    if unknown:
        raise KeyError(f"unknown demo model(s) {unknown}; known: {sorted(DEMO_MODELS)}")
    root.mkdir(parents=True, exist_ok=True)
    folders: dict[str, Path] = {}
    for name in selected:
        spec = DEMO_MODELS[name]
        folder = root / name
        folders[name] = folder
        if is_complete(folder, name, spec):
            continue
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=root))
        try:
            write_demo_model(tmp, spec, name)
            os.chmod(tmp, 0o755)  # mkdtemp makes it owner-only; the folder is meant to be shared
            for f in tmp.iterdir():
                os.chmod(f, 0o644)
            (tmp / _STAMP).write_text(json.dumps({"name": name, "digest": _spec_digest(name, spec), **asdict(spec)}))
            if folder.exists():
                if is_complete(folder, name, spec):  # another process finished it meanwhile
                    continue
                shutil.rmtree(folder, ignore_errors=True)
            try:
                os.rename(tmp, folder)
            except OSError:
                if not is_complete(folder, name, spec):
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return folders
