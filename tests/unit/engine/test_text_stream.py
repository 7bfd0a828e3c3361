"""Streaming text: incremental detokenisation across multi-byte characters, and stop strings that never leak."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.engine.stop import StopStringMatcher
from runtime.tokenizer import IncrementalDetokenizer, TextTokenizer

MULTIBYTE_TEXT = "Größe 😀🚀 日本語のテキスト — привет, мир! 🤖✨ naïve café 🎉"


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return TextTokenizer.from_dir(tiny_model_dir)


def test_the_text_really_splits_characters_across_tokens(tokenizer):
    # Guards the next test's meaning: some single tokens of this text decode to a broken character.
    ids = tokenizer.encode(MULTIBYTE_TEXT)
    assert any("\ufffd" in tokenizer.decode([i]) for i in ids)


def test_incremental_deltas_rebuild_the_text_without_broken_characters(tokenizer):
    ids = tokenizer.encode(MULTIBYTE_TEXT)
    detok = IncrementalDetokenizer(tokenizer)
    deltas = [detok.feed([i]) for i in ids]
    deltas.append(detok.flush())
    assert "".join(deltas) == MULTIBYTE_TEXT
    assert not any("\ufffd" in d for d in deltas)


def test_deltas_with_prompt_context_and_special_tokens(tokenizer):
    prompt = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": "héllo"}]))
    out_ids = tokenizer.encode("日本 ok 😀") + [tokenizer.token_to_id("<|im_end|>")]
    detok = IncrementalDetokenizer(tokenizer, context_token_ids=prompt)
    text = "".join(detok.feed([i]) for i in out_ids) + detok.flush()
    assert text == "日本 ok 😀"  # the prompt is context only; the special token is skipped


@settings(max_examples=80, deadline=None)
@given(st.text(min_size=1, max_size=40), st.data())
def test_any_text_round_trips_in_any_chunking(tokenizer, text, data):
    ids = tokenizer.encode(text)
    detok = IncrementalDetokenizer(tokenizer)
    out, i = [], 0
    while i < len(ids):
        n = data.draw(st.integers(1, 4))
        out.append(detok.feed(ids[i : i + n]))
        i += n
    out.append(detok.flush())
    assert "".join(out) == tokenizer.decode(ids)


def test_stop_string_split_across_deltas_is_never_emitted():
    m = StopStringMatcher(["STOP"])
    emitted = [m.push(d) for d in ["hello S", "T", "O", "P and more"]]
    assert "".join(emitted) == "hello " and m.is_stopped
    assert emitted[1] == emitted[2] == ""  # "ST", "STO" were held back
    assert m.push("more") == "" and m.flush() == ""


def test_held_prefix_is_released_when_it_turns_out_not_to_be_a_stop():
    m = StopStringMatcher(["abc", "xyz"])
    assert m.push("1ab") == "1"
    assert m.push("d") == "abd"
    assert m.push("xy") == ""
    assert m.flush() == "xy" and not m.is_stopped


def test_earliest_stop_string_wins():
    m = StopStringMatcher(["world", "lo w"])
    assert m.push("hello world") == "hel"


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="abcx", max_size=30), st.lists(st.text(alphabet="abc", min_size=1, max_size=4),
                                                     min_size=1, max_size=3), st.data())
def test_matcher_equals_cutting_at_the_first_stop(text, stops, data):
    """Generation stops as soon as a piece completes a stop string (earliest start among those): the same as
    re-scanning the whole text after each piece, which is what this reference does."""
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=6)))
    pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
    m = StopStringMatcher(stops)
    out = "".join(m.push(p) for p in pieces)
    out += m.flush()
    expected, seen, is_stopped = text, "", False
    for piece in pieces:
        seen += piece
        starts = [seen.find(s) for s in stops if s in seen]
        if starts:
            expected, is_stopped = seen[: min(starts)], True
            break
    assert out == expected
    assert m.is_stopped == is_stopped
