"""The default model as users requantize it. Three files:
- Q4_K_M made by llama.cpp's own quantizer (llama-cpp-python's binding of
  llama_model_quantize, requantizing the Q4_1 original): Q4_K and Q6_K where
  rows are a multiple of 256, Q5_0 and Q8_0 where they are not (this model's
  576-wide rows), as a user's `llama-quantize ... Q4_K_M` gives;
- IQ4_XS by the same quantizer: IQ4_XS, and IQ4_NL where rows are not a
  multiple of 256;
- one with Q5_0 and Q5_1 tensors written by the `gguf` package.
Each loads, and our exact mode evaluates it as a float64 evaluation of the
same file does (numpy_reference.py, which shares nothing with our engine but
the file): the bound test_rounding.py holds the Q4_1 original to. (Q5_K, which
neither quantizer here writes for this model, is checked by
test_dequantize.py on synthetic blocks.)"""
import ctypes

import gguf
import llama_cpp
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

import gguf_files
import numpy_reference
import probe
import requantize

TOKENS = 16
CENTERED_MAX = 0.05
RULES = [(r"blk\.\d+\.attn_[kv]\.weight", T.Q5_0), (r"blk\.\d+\.ffn_down\.weight", T.Q5_1)]


@pytest.fixture(scope="module")
def variant(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("gguf") / "requantized.gguf")
    changed = requantize.requantize(probe.MODEL, path, RULES)
    assert sorted(set(changed.values())) == [T.Q5_0, T.Q5_1]
    return path


def llama_quantize(directory, ftype):
    """The test model requantized by llama.cpp's quantizer to `ftype`."""
    path = str(directory / f"{ftype}.gguf")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.allow_requantize = True
    params.nthread = probe.THREADS
    assert llama_cpp.llama_model_quantize(probe.MODEL.encode(), path.encode(),
                                          ctypes.byref(params)) == 0
    return path


@pytest.fixture(scope="module")
def q4_k_m(tmp_path_factory):
    return llama_quantize(tmp_path_factory.mktemp("gguf"), "Q4_K_M")


@pytest.fixture(scope="module")
def iq4_xs(tmp_path_factory):
    return llama_quantize(tmp_path_factory.mktemp("gguf"), "IQ4_XS")


def test_llama_quantizes_with_the_types_we_load(q4_k_m, iq4_xs):
    assert {T.Q4_K, T.Q6_K, T.Q5_0} <= {t.tensor_type for t in gguf_files.read(q4_k_m).tensors}
    assert {T.IQ4_XS, T.IQ4_NL} <= {t.tensor_type for t in gguf_files.read(iq4_xs).tensors}


def test_the_file_holds_the_five_bit_types(variant):
    kinds = {t.name: t.tensor_type for t in gguf_files.read(variant).tensors}
    assert kinds["blk.0.attn_k.weight"] == T.Q5_0
    assert kinds["blk.29.attn_v.weight"] == T.Q5_0
    assert kinds["blk.7.ffn_down.weight"] == T.Q5_1
    assert kinds["blk.7.ffn_up.weight"] == T.Q4_1


@pytest.mark.parametrize("tensor", ["blk.3.attn_k.weight", "blk.3.ffn_down.weight"])
def test_dequantization_matches_the_package(variant, tensor):
    t = next(t for t in gguf_files.read(variant).tensors if t.name == tensor)
    expected = gguf.quants.dequantize(t.data, t.tensor_type).reshape(-1).astype(np.float32)
    np.testing.assert_array_equal(probe.dequantize(variant, tensor), expected)


@pytest.mark.parametrize("file", ["q4_k_m", "iq4_xs", "variant"])
def test_greedy_logits_match_float64(request, file):
    path = request.getfixturevalue(file)
    [(_, prompt)] = probe.chat([[("user", "Explain what a hash table is in two sentences.")]])
    continuation, reference = numpy_reference.greedy(prompt, TOKENS, path)
    sequence = prompt + continuation
    ours = probe.logits([sequence[:-1]], f"--positions={TOKENS}", f"--model={path}",
                        "--matmul=f32")[0].reshape(TOKENS, -1).astype(np.float64)
    d = ours - reference
    centered = float(np.abs(d - d.mean(axis=1, keepdims=True)).max())
    print(f"{file}: centered max {centered:.4f} over {TOKENS} positions")
    assert centered <= CENTERED_MAX
    assert [int(i) for i in ours.argmax(axis=1)] == continuation
