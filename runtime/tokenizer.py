"""Text <-> token ids for a local Hugging Face model folder, without torch: the gateway tokenises prompts with it and
the worker's engine detokenises outputs with it (both import it from here, the layer below them).

`TextTokenizer` wraps `tokenizer.json` (the `tokenizers` library) and renders the chat template found in
`tokenizer_config.json` (or `chat_template.jinja`) with a sandboxed jinja2, as transformers does.
`IncrementalDetokenizer` turns a stream of token ids into text deltas that never split a multi-byte character.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Sequence

from tokenizers import Tokenizer

# Used when a model folder carries no chat template: plain "role: content" lines, then the assistant's turn.
PLAIN_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)

# The replacement character a byte-level decoder yields for an incomplete UTF-8 sequence.
_REPLACEMENT_CHAR = "\ufffd"


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, inverted: the printable character each byte is written as -> the byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) \
        + list(range(ord("\u00ae"), ord("\u00ff") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_UNICODE_TO_BYTE = _byte_level_alphabet()


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    with path.open(encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{path.name}: expected a JSON object")
    return data


def _token_content(value: Any) -> str | None:
    """tokenizer_config.json writes special tokens either as a string or as an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _as_id_tuple(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value)
    raise ValueError(f"eos_token_id must be an int or a list of ints, got {value!r}")


class TextTokenizer:
    """A model's tokenizer: encode, decode, chat template, end-of-sequence ids. Construct with `from_dir`."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        chat_template: str | None = None,
        eos_token_ids: Sequence[int] = (),
        bos_token: str | None = None,
        eos_token: str | None = None,
    ) -> None:
        self._tokenizer = tokenizer
        self._chat_template_source = chat_template or PLAIN_CHAT_TEMPLATE
        self.has_chat_template = chat_template is not None
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(int(i) for i in eos_token_ids))
        self.vocab_size: int = tokenizer.get_vocab_size(with_added_tokens=True)
        self._compiled_template = None  # compiled lazily: most callers never render a chat

    @classmethod
    def from_dir(cls, path: str | Path) -> "TextTokenizer":
        """Load `<path>/tokenizer.json`; chat template and special tokens from `tokenizer_config.json`,
        `chat_template.jinja`; end-of-sequence ids from `generation_config.json`, `tokenizer_config.json` and
        `config.json` (their union)."""
        root = Path(path)
        tokenizer_file = root / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise FileNotFoundError(f"no tokenizer.json in {root}")
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
        tok_config = _read_json(root / "tokenizer_config.json")
        gen_config = _read_json(root / "generation_config.json")
        model_config = _read_json(root / "config.json")

        chat_template = tok_config.get("chat_template")
        if isinstance(chat_template, list):  # several named templates: take the default one
            named = {t.get("name"): t.get("template") for t in chat_template if isinstance(t, dict)}
            chat_template = named.get("default") or next(iter(named.values()), None)
        template_file = root / "chat_template.jinja"
        if chat_template is None and template_file.is_file():
            chat_template = template_file.read_text(encoding="utf-8")

        eos_token = _token_content(tok_config.get("eos_token"))
        bos_token = _token_content(tok_config.get("bos_token"))
        eos_ids = list(_as_id_tuple(gen_config.get("eos_token_id")))
        if eos_token is not None and (eos_id := tokenizer.token_to_id(eos_token)) is not None:
            eos_ids.append(eos_id)
        if not eos_ids:
            eos_ids.extend(_as_id_tuple(model_config.get("eos_token_id")))
        return cls(
            tokenizer, chat_template=chat_template, eos_token_ids=eos_ids, bos_token=bos_token, eos_token=eos_token
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`. Special-token strings in the text (e.g. from a chat template) become their ids; no
        BOS/EOS is added (a chat template adds what the model expects)."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects str, got {type(text).__name__}")
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`. Ids outside the vocabulary decode to nothing (random-weight models with a padded
        embedding can sample them)."""
        return self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)

    def token_piece(self, token_id: int) -> tuple[str, bytes]:
        """One token's own text and bytes, as OpenAI's logprobs show a token: the bytes it stands for (a byte-level
        BPE token's mapped characters, a SentencePiece `<0xNN>` byte or `▁` space), and as text those bytes decoded,
        or `bytes:\\xNN...` when they end inside a multi-byte character (vLLM's convention)."""
        piece = self._tokenizer.id_to_token(int(token_id))
        if piece is None:
            return "", b""
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            raw = bytes([int(piece[3:5], 16)])
        elif self._is_byte_level and all(c in _UNICODE_TO_BYTE for c in piece):
            raw = bytes(_UNICODE_TO_BYTE[c] for c in piece)
        else:
            raw = piece.replace("\u2581", " ").encode("utf-8")
        try:
            return raw.decode("utf-8"), raw
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in raw), raw

    def vocab_pieces(self, vocab_size: int) -> tuple[list[str], bool]:
        """Each token id's piece as the tokenizer stores it, for a grammar compiler (grammar.py), padded with "" to
        the model's `vocab_size`; special tokens are "" (never text inside a grammar); and whether the pieces are
        byte-level BPE (else SentencePiece with byte fallback)."""
        pieces = [""] * max(vocab_size, self.vocab_size)
        for piece, token_id in self._tokenizer.get_vocab(with_added_tokens=True).items():
            pieces[token_id] = piece
        for token_id, added in self._tokenizer.get_added_tokens_decoder().items():
            if added.special:
                pieces[token_id] = ""
        return pieces[: max(vocab_size, 1)] if vocab_size else pieces, self._is_byte_level

    @property
    def tool_call_format(self) -> str:
        """How this model writes a tool call: "hermes" (<tool_call>{json}</tool_call>, Qwen2.5) unless its template
        is Llama 3's ("llama3_json": a bare {"name", "parameters"} object)."""
        return "llama3_json" if "<|eot_id|>" in self._chat_template_source else "hermes"

    @property
    def _is_byte_level(self) -> bool:
        return type(self._tokenizer.decoder).__name__ == "ByteLevel"

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tools: list[dict] | None = None) -> str:
        """Render `messages` ([{"role": ..., "content": ...}], assistant `tool_calls` too) with the model's chat
        template (jinja2, sandboxed), or with a plain "role: content" template when the model has none. `tools`:
        the OpenAI tool definitions, for a template that renders them (as transformers passes them)."""
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise ValueError("messages must be a list of dicts")
        for m in messages:
            if "role" not in m or "content" not in m:
                raise ValueError("each message needs 'role' and 'content'")
        template = self._template()
        return template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
        )

    def _template(self):
        if self._compiled_template is None:
            from jinja2.exceptions import TemplateError
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            def raise_exception(message: str) -> None:
                raise TemplateError(message)

            # The same environment options transformers uses, so templates written for it render identically.
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=["jinja2.ext.loopcontrols"])
            env.globals["raise_exception"] = raise_exception
            env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, ensure_ascii=False, indent=indent)
            self._compiled_template = env.from_string(self._chat_template_source)
        return self._compiled_template


class IncrementalDetokenizer:
    """Feed token ids as they are sampled, get the text they add. A multi-byte character split across tokens is
    held back until its last byte arrives, so a delta never contains a broken character.

    It decodes a short window of recent tokens and emits what the window's text gained, minus a trailing
    incomplete character. Decoding a window (not single tokens) is exact for byte-level BPE and also right for
    tokenizers whose pieces change with their left context (SentencePiece-style leading spaces);
    `context_token_ids` (e.g. the prompt's tail) seeds that left context.
    """

    # How many already-emitted tokens are kept as left context when the window moves on.
    _NUM_CONTEXT_TOKENS = 6

    def __init__(
        self, tokenizer: TextTokenizer, *, skip_special_tokens: bool = True, context_token_ids: Sequence[int] = ()
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._window_ids: list[int] = [int(i) for i in list(context_token_ids)[-self._NUM_CONTEXT_TOKENS :]]
        # Characters of the window's decoded text already emitted (or belonging to the context).
        self._num_emitted_chars = len(self._decode(self._window_ids))

    def feed(self, token_ids: Iterable[int]) -> str:
        """Append token ids; return the text they complete (may be "" while a character is incomplete)."""
        self._window_ids.extend(int(i) for i in token_ids)
        text = self._decode(self._window_ids)
        is_complete = not text.endswith(_REPLACEMENT_CHAR)
        # A trailing U+FFFD is an incomplete character whose next bytes are still to come: hold it back.
        stable = text if is_complete else text.rstrip(_REPLACEMENT_CHAR)
        delta = stable[self._num_emitted_chars :] if len(stable) > self._num_emitted_chars else ""
        self._num_emitted_chars = max(self._num_emitted_chars, len(stable))
        if is_complete:
            self._move_window()
        return delta

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character comes out as U+FFFD): call at end of stream."""
        text = self._decode(self._window_ids)
        delta = text[self._num_emitted_chars :] if len(text) > self._num_emitted_chars else ""
        self._num_emitted_chars = max(self._num_emitted_chars, len(text))
        self._move_window()
        return delta

    def _move_window(self) -> None:
        # Only at a complete character boundary: the kept context then decodes to whole characters.
        if len(self._window_ids) > 2 * self._NUM_CONTEXT_TOKENS:
            self._window_ids = self._window_ids[-self._NUM_CONTEXT_TOKENS :]
            self._num_emitted_chars = len(self._decode(self._window_ids))

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special) if ids else ""
