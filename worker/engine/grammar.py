"""Grammar-constrained decoding (structured outputs, docs/api.md): xgrammar compiled against the model's tokenizer.

A request whose `SamplingParams.guided` is set gets a matcher; each step, before a token is chosen, the sampler
asks every such row's matcher which tokens may come next (a bitmask over the vocabulary), sets the others to -inf,
and after the draw advances the matcher with the token taken. EOS is one of the matcher's stop tokens: allowed only
where the grammar accepts, so a constrained output ends only when it is complete.

Compiling a grammar costs milliseconds to seconds (it walks the whole vocabulary); it is done once per schema
(`GrammarBook` caches by the schema's text) when a request is added, so a bad schema fails that request alone,
before it reaches the engine's step. xgrammar imports torch and takes seconds to import: imported on the first
guided request only.
"""
from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Sequence

import torch

from contracts.requests import GuidedDecoding

if TYPE_CHECKING:
    from runtime.tokenizer import TextTokenizer

MAX_CACHED_GRAMMARS = 256  # compiled grammars kept per engine (a compiled grammar is some KB to a few MB)


class GrammarBook:
    """Compiled grammars of one engine's tokenizer, by schema, and the live matchers of its requests."""

    def __init__(self, tokenizer: "TextTokenizer", vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size  # the model's logits width (may exceed the tokenizer's)
        self._eos_token_ids = list(eos_token_ids)
        self._compiler = None
        self._compiled: OrderedDict[tuple[str, str], object] = OrderedDict()
        self._lock = threading.Lock()  # add_request (compile) and step (matchers) run on different threads
        self._matchers: dict[str, object] = {}

    def compile(self, guided: GuidedDecoding):
        """The compiled grammar of `guided` (cached); ValueError when the schema cannot be compiled."""
        key = (guided.kind, guided.json_schema)
        with self._lock:
            hit = self._compiled.get(key)
            if hit is not None:
                self._compiled.move_to_end(key)
                return hit
            compiler = self._compiler or self._new_compiler()
        try:
            if guided.kind == "json_object":
                compiled = compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
            else:
                compiled = compiler.compile_json_schema(bounded_strings_as_patterns(guided.json_schema),
                                                        any_whitespace=False, strict_mode=True)
        except Exception as exc:  # noqa: BLE001 - xgrammar raises several types for a schema it cannot take
            raise ValueError(f"response_format: the JSON schema cannot be compiled: {exc}") from None
        with self._lock:
            self._compiled[key] = compiled
            while len(self._compiled) > MAX_CACHED_GRAMMARS:
                self._compiled.popitem(last=False)
        return compiled

    @property
    def num_compiled(self) -> int:
        return len(self._compiled)

    def _new_compiler(self):
        import xgrammar as xgr

        pieces, is_byte_level = self._tokenizer.vocab_pieces(self._vocab_size)
        vocab_type = xgr.VocabType.BYTE_LEVEL if is_byte_level else xgr.VocabType.BYTE_FALLBACK
        info = xgr.TokenizerInfo(pieces, vocab_type, vocab_size=self._vocab_size,
                                 stop_token_ids=self._eos_token_ids)
        self._compiler = xgr.GrammarCompiler(info, max_threads=1)  # the engine's CPU is shared with the step loop
        return self._compiler

    # ---- matchers (engine thread) -------------------------------------------------------------------------
    def add(self, request_id: str, guided: GuidedDecoding, output_token_ids: Sequence[int] = ()) -> None:
        """A matcher for a request; `output_token_ids` it already has (P/D: the prefill instance's first token)."""
        import xgrammar as xgr

        matcher = xgr.GrammarMatcher(self.compile(guided))
        for token in output_token_ids:
            if not matcher.accept_token(int(token)):
                raise ValueError(f"token {token} does not follow the request's grammar")
        self._matchers[request_id] = matcher

    def remove(self, request_id: str) -> None:
        self._matchers.pop(request_id, None)

    def has(self, request_id: str) -> bool:
        return request_id in self._matchers

    def mask(self, logits: torch.Tensor, request_ids: Sequence[str]) -> torch.Tensor:
        """Set to -inf, in place, every token a guided row's grammar does not allow next; returns the logits."""
        rows = [i for i, rid in enumerate(request_ids) if rid in self._matchers]
        if not rows:
            return logits
        import xgrammar as xgr

        bitmask = xgr.allocate_token_bitmask(logits.shape[0], self._vocab_size)
        for i in rows:
            self._matchers[request_ids[i]].fill_next_token_bitmask(bitmask, i)
        xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device, non_blocking=True),
                                        vocab_size=self._vocab_size, indices=rows)
        return logits

    def accept(self, request_ids: Sequence[str], token_ids: Sequence[int]) -> None:
        for rid, token in zip(request_ids, token_ids):
            matcher = self._matchers.get(rid)
            if matcher is not None and not matcher.is_terminated():
                matcher.accept_token(int(token))


_STRING_CHAR = r'[^\x00-\x1f"\\]'  # a JSON string character that needs no escape


def bounded_strings_as_patterns(schema_text: str) -> str:
    """The schema with every plain string that has minLength / maxLength written as the equivalent pattern over
    unescaped characters. xgrammar (0.2.9) compiles a length-bounded string to a class that lets raw control
    characters through, which JSON forbids (json.loads refuses the output); its pattern rule does not. The outputs
    allowed stay a subset of the schema's (escapes are left out of bounded strings)."""
    schema = json.loads(schema_text)

    def walk(node):
        if isinstance(node, list):
            return [walk(v) for v in node]
        if not isinstance(node, dict):
            return node
        node = {k: walk(v) for k, v in node.items()}
        is_bounded = "minLength" in node or "maxLength" in node
        if node.get("type") == "string" and is_bounded and not ({"pattern", "format", "enum", "const"} & node.keys()):
            low, high = int(node.pop("minLength", 0)), node.pop("maxLength", None)
            node["pattern"] = f"^{_STRING_CHAR}{{{low},{'' if high is None else int(high)}}}$"
        return node

    return json.dumps(walk(schema), sort_keys=True, separators=(",", ":"))
