"""Our hand-written pre-tokenizers against the regular expressions they
implement, run by Python's `regex` module (which supports \\p{L}, \\p{N} and
look-ahead like the Rust/Oniguruma engines do)."""
import pytest
import regex

import corpus
import probe

GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3 = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"""
          r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")


def reference(kind, text):
    if kind == "smollm":
        pieces = []
        for part in regex.split(r"(\p{N})", text):
            if part:
                pieces += regex.findall(GPT2, part) if not regex.fullmatch(r"\p{N}", part) else [part]
        return pieces
    return regex.findall({"gpt2": GPT2, "llama-bpe": LLAMA3, "qwen2": QWEN2}[kind], text)


@pytest.mark.parametrize("kind", ["gpt2", "smollm", "llama-bpe", "qwen2"])
def test_pieces_equal_the_regular_expression(kind):
    # The regex engine and ours agree on Unicode classes for these scripts.
    strings = [s for s in corpus.all_strings() if s]
    ours = probe.pretokenize(strings, kind)
    mismatches = [(s, o, reference(kind, s)) for s, o in zip(strings, ours) if o != reference(kind, s)]
    assert not mismatches, f"{len(mismatches)} differ; first: {mismatches[0]!r}"
