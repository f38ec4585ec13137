"""Our tokenizer on the vocabularies people use: llama.cpp's vocabulary-only
GGUFs (vendor/llama.cpp/models/ggml-vocab-*.gguf in llama-cpp-python's
sdist), each with test inputs (.inp) and the ids Hugging Face's tokenizer of
that model gives them (.out, written by llama.cpp's convert_hf_to_gguf_update.py).
Ids are compared as llama.cpp's test-tokenizer-0 compares them: no BOS, and
the text of control tokens is plain text."""
import os
import subprocess

import pytest

import gguf_files
import probe
import sdist

CLI = os.environ.get("TANDEM_CLI", "build/bin/tandem")
SEPARATOR = "\n__ggml_vocab_test__\n"

# Every vocabulary the sdist has expected ids for: byte-level BPE,
# SentencePiece (llama-spm, phi-3), Gemma 4's merges and BERT's WordPiece.
VOCABULARIES = [
    "bert-bge", "command-r", "deepseek-coder", "deepseek-llm", "falcon", "gemma-4", "gpt-2",
    "llama-bpe", "llama-spm", "mpt", "phi-3", "qwen2", "qwen35", "refact", "starcoder",
]


def vocab_file(name):
    return sdist.vocab_file(name)


def cases(name):
    """[(text, expected ids)] of one vocabulary."""
    with open(vocab_file(name) + ".inp", encoding="utf-8", newline="") as f:
        texts = f.read().split(SEPARATOR)[:-1]
    with open(vocab_file(name) + ".out", encoding="utf-8") as f:
        lines = f.read().split("\n")[:len(texts)]
    return [(text, [int(x) for x in line.split()]) for text, line in zip(texts, lines)]


def test_every_vocabulary_with_expected_ids_is_covered():
    with_ids = sorted(f[len("ggml-vocab-"):-len(".gguf.out")]
                      for f in os.listdir(sdist.vocab_dir()) if f.endswith(".gguf.out"))
    assert sorted(VOCABULARIES) == with_ids


@pytest.mark.parametrize("name", VOCABULARIES)
def test_token_ids_equal_hugging_faces(name):
    examples = cases(name)
    assert len(examples) >= 40
    texts = [text for text, _ in examples]
    with probe.using_model(vocab_file(name)):
        ours = probe.tokenize(texts, parse_special=False)
    mismatches = [(t, o, e) for (t, e), o in zip(examples, ours) if o != e]
    assert not mismatches, f"{len(mismatches)} of {len(examples)} differ; first: {mismatches[0]!r}"


def cli(*args, text=None):
    return subprocess.run([CLI, "tokenize", *args], input=text, capture_output=True, text=True,
                          timeout=120, check=False)


@pytest.mark.parametrize("name,bos", [("llama-spm", "<s>"), ("qwen2", None), ("gemma-4", "<bos>"),
                                      ("bert-bge", None)])
def test_tandem_tokenize_works_on_vocabulary_only_files(name, bos):
    text, expected = next((t, e) for t, e in cases(name) if t == "Hello world")
    encoded = cli(f"--model={vocab_file(name)}", text)
    assert encoded.returncode == 0, encoded.stderr
    ids = [int(x) for x in encoded.stdout.split()]
    # As a Generate prompt: BOS where the vocabulary asks for it.
    if bos:
        field = gguf_files.read(vocab_file(name)).fields["tokenizer.ggml.bos_token_id"]
        assert ids == [int(field.parts[field.data[0]][0])] + expected
    else:
        assert ids == expected
    decoded = cli(f"--model={vocab_file(name)}", "--ids", " ".join(map(str, ids)))
    assert decoded.returncode == 0, decoded.stderr
    # BERT's normalizer lowercases.
    assert decoded.stdout == (bos or "") + (text.lower() if name == "bert-bge" else text) + "\n"
    # Text from stdin when there is no argument.
    from_stdin = cli(f"--model={vocab_file(name)}", text=text)
    assert from_stdin.stdout == encoded.stdout


def test_tandem_tokenize_names_bad_input():
    model = f"--model={vocab_file('qwen2')}"
    bad_id = cli(model, "--ids", "1 2 999999")
    assert bad_id.returncode == 2 and "'999999' is not a token id" in bad_id.stderr
    missing = cli("--model=/nonexistent.gguf", "x")
    assert missing.returncode == 1 and "/nonexistent.gguf" in missing.stderr
