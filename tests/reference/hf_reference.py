"""Hugging Face `tokenizers` built from the GGUF's own metadata (vocabulary,
merges, token types, pre-tokenizer name): an independent implementation of
the tokenizer our engine reads from the same file."""
import functools

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

import gguf_files
import probe

CONTROL, USER_DEFINED = 3, 4


def _pre_tokenizer(name):
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if name in ("smollm", "starcoder", "refact"):
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if name in ("gpt2", "default"):
        return byte_level
    raise ValueError(f"no reference pre-tokenizer for {name}")


@functools.lru_cache(maxsize=1)
def tokenizer():
    reader = gguf_files.read(probe.MODEL)
    f = reader.fields
    tokens = f["tokenizer.ggml.tokens"].contents()
    types = f["tokenizer.ggml.token_type"].contents()
    merges = [tuple(m.split(" ", 1)) for m in f["tokenizer.ggml.merges"].contents()]
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tk.pre_tokenizer = _pre_tokenizer(f["tokenizer.ggml.pre"].contents())
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                           for i in range(len(tokens)) if types[i] in (CONTROL, USER_DEFINED)])
    return tk
