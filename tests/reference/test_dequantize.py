"""Dequantization against the gguf package's numpy dequantizer, on the model's
real tensors and on synthetic files covering every supported type."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter
from gguf.quants import dequantize

import gguf_files
import probe

REAL = ["token_embd.weight", "blk.0.attn_q.weight", "blk.7.ffn_down.weight",
        "blk.29.ffn_up.weight", "output_norm.weight"]


@pytest.mark.parametrize("name", REAL)
def test_real_tensors_match(name):
    tensor = next(t for t in gguf_files.read(probe.MODEL).tensors if t.name == name)
    expected = dequantize(tensor.data, tensor.tensor_type).reshape(-1).astype(np.float32)
    ours = probe.dequantize(probe.MODEL, name)
    np.testing.assert_array_equal(ours, expected)


BLOCK = {T.Q8_0: (32, 34), T.Q4_0: (32, 18), T.Q4_1: (32, 20), T.Q5_0: (32, 22),
         T.Q5_1: (32, 24), T.Q4_K: (256, 144), T.Q5_K: (256, 176), T.Q6_K: (256, 210),
         T.IQ4_NL: (32, 18), T.IQ4_XS: (256, 136)}
# Offsets of the half-precision scales in each block (kept finite and small).
SCALES = {T.Q8_0: [0], T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2],
          T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208], T.IQ4_NL: [0], T.IQ4_XS: [0]}


def random_tensor(kind, rows, cols, rng):
    if kind == T.F16:
        return rng.standard_normal((rows, cols)).astype(np.float16), None
    if kind == T.BF16:
        bits = (rng.standard_normal((rows, cols)).astype(np.float32).view(np.uint32) >> 16)
        return bits.astype(np.uint16).view(np.uint8).reshape(rows, cols * 2), kind
    elements, size = BLOCK[kind]
    blocks = rows * cols // elements
    raw = rng.integers(0, 256, size=(blocks, size), dtype=np.uint8)
    for off in SCALES[kind]:
        scales = rng.uniform(0.001, 0.05, size=blocks).astype(np.float16)
        raw[:, off:off + 2] = scales.view(np.uint8).reshape(blocks, 2)
    return raw.reshape(rows, -1), kind


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("gguf") / "synthetic.gguf")
    rng = np.random.default_rng(3)
    writer = GGUFWriter(path, "llama")
    kinds = [T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q4_K, T.Q5_K, T.Q6_K,
             T.IQ4_NL, T.IQ4_XS]
    for kind in kinds:
        data, raw_dtype = random_tensor(kind, 4, 512, rng)
        writer.add_tensor(kind.name, data, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, kinds


def test_every_supported_type_matches(synthetic):
    path, kinds = synthetic
    tensors = {t.name: t for t in gguf_files.read(path).tensors}
    for kind in kinds:
        t = tensors[kind.name]
        expected = dequantize(t.data, t.tensor_type).reshape(-1).astype(np.float32)
        ours = probe.dequantize(path, kind.name)
        assert ours.size == 4 * 512, kind.name
        np.testing.assert_allclose(ours, expected, rtol=1e-6, atol=0, err_msg=kind.name)
