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
QWEN35 = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"""
          r""" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
# The letters of DeepSeek LLM's second expression.
DEEPSEEK_LETTERS = (
    r"A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
    r"\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a"
    r"\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556"
    r"\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b"
    r"\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d"
    r"\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
    r"\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4"
    r"\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128"
    r"\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184"
    r"\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b"
    r"\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17"
    r"\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    r"\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2"
    r"\U000118a0-\U000118df\U0001e900-\U0001e943"
)
# Families whose tokenizer.json has a sequence of Split pre-tokenizers: each
# expression splits the pieces of the ones before it. (`\Z` is the `$` of the
# Rust and Oniguruma engines: the end of the piece, not before a final newline.)
SEQUENCES = {
    "falcon": [r"[\p{P}\$\+<=>\^~\|`]+",
               r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)""",
               r"[0-9][0-9][0-9]"],
    "deepseek-llm": [
        r"[\r\n]",
        r"\s?[" + DEEPSEEK_LETTERS + r"]+",
        r"\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
        r"\s+\Z",
        r"[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
        r"\p{N}+"],
    "deepseek-coder": [r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+",
                       r"[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+", r"\p{N}"],
}


def split_sequence(text, expressions):
    pieces = [text]
    for expression in expressions:
        split = []
        for piece in pieces:
            end = 0
            for match in regex.finditer(expression, piece):
                if match.start() > end:
                    split.append(piece[end:match.start()])
                split.append(match.group())
                end = match.end()
            if end < len(piece):
                split.append(piece[end:])
        pieces = split
    return pieces


def reference(kind, text):
    if kind == "smollm":
        pieces = []
        for part in regex.split(r"(\p{N})", text):
            if part:
                pieces += regex.findall(GPT2, part) if not regex.fullmatch(r"\p{N}", part) else [part]
        return pieces
    if kind in SEQUENCES:
        return split_sequence(text, SEQUENCES[kind])
    return regex.findall({"gpt2": GPT2, "llama-bpe": LLAMA3, "qwen2": QWEN2, "qwen35": QWEN35}[kind],
                         text)


@pytest.mark.parametrize("kind", ["gpt2", "smollm", "llama-bpe", "qwen2", "qwen35", "falcon",
                                  "deepseek-llm", "deepseek-coder"])
def test_pieces_equal_the_regular_expression(kind):
    # The regex engine and ours agree on Unicode classes for these scripts.
    strings = [s for s in corpus.all_strings() if s]
    ours = probe.pretokenize(strings, kind)
    mismatches = [(s, o, reference(kind, s)) for s, o in zip(strings, ours) if o != reference(kind, s)]
    assert not mismatches, f"{len(mismatches)} differ; first: {mismatches[0]!r}"
