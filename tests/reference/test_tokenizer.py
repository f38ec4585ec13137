"""Our tokenizer against Hugging Face `tokenizers` (built from the same GGUF
metadata) on 300+ strings, and exact decoding."""
import corpus
import hf_reference
import probe


def test_corpus_is_large_and_varied():
    strings = corpus.all_strings()
    assert len(strings) >= 300
    assert any("\t" in s for s in strings) and any("<|im_start|>" in s for s in strings)


def test_token_ids_equal_hugging_face():
    strings = corpus.all_strings()
    ours = probe.tokenize(strings)
    reference = [hf_reference.tokenizer().encode(s, add_special_tokens=False).ids for s in strings]
    mismatches = [(s, o, r) for s, o, r in zip(strings, ours, reference) if o != r]
    assert not mismatches, f"{len(mismatches)} of {len(strings)} differ; first: {mismatches[0]!r}"


def test_special_token_text_is_plain_when_not_parsed():
    ours = probe.tokenize(["<|im_start|>user"], parse_special=False)[0]
    assert 1 not in ours  # <|im_start|> is id 1
    assert probe.tokenize(["<|im_start|>user"])[0][0] == 1


def test_decode_of_encode_is_exact():
    strings = corpus.all_strings()
    ids = probe.tokenize(strings)
    decoded = probe.detokenize(ids)
    for s, d in zip(strings, decoded):
        assert d == s.encode(), (s, d)


def test_bytes_without_a_token_are_dropped_like_hugging_face():
    # SmolLM2's vocabulary has no token for byte 0x04 (a control character).
    text = "a\x04b"
    ours = probe.tokenize([text])[0]
    assert ours == hf_reference.tokenizer().encode(text, add_special_tokens=False).ids
    assert probe.detokenize([ours])[0] == b"ab"


def test_streaming_never_emits_a_broken_character():
    # Emoji and CJK characters span several byte-level tokens in this vocabulary.
    strings = [s for s in corpus.all_strings() if any(ord(c) > 0x7FF for c in s)]
    assert len(strings) > 50
    ids = probe.tokenize(strings, parse_special=False)
    multi = sum(1 for s, i in zip(strings, ids) if len(i) > len(s))
    assert multi > 10, "the corpus must contain characters split across tokens"
    for s, chunks in zip(strings, probe.stream_detokenize(ids)):
        for chunk in chunks:
            chunk.decode("utf-8")  # raises on a partial or invalid sequence
        assert b"".join(chunks) == s.encode()
