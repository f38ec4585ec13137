"""Our quantizer (`tandem-bench --write_gguf`) against llama.cpp's on the
same weights.

tandem-bench writes one random model (the SmolLM2-135M shape: 576-wide rows,
which K-quants' 256-element blocks do not divide, and 1536-wide ones, which
they do) twice: as F32, and in a quantized file type. llama.cpp's own
quantizer (llama_model_quantize) quantizes the F32 file to the same file
type. Then, tensor by tensor, decoded by the gguf package:
- the types are llama-quantize's (its dry run names a tensor it would
  convert; none may be named, for every file type);
- Q8_0, Q5_0 and Q5_1 blocks are byte for byte llama.cpp's (both round as
  ggml's reference quantizers do), and so are IQ4_NL and IQ4_XS blocks (the
  same search, step for step);
- K-quant tensors (no single right answer) are at most 2% further from the
  F32 weights, in RMS, than llama.cpp's are;
and llama.cpp loads and runs the file we wrote."""
import ctypes
import os
import subprocess
import sys

import gguf
import llama_cpp
import numpy as np
import pytest

import gguf_files
import probe

BENCH = os.environ.get("TANDEM_BENCH", "build/bin/tandem-bench")
MODEL = "random:smollm2-135m@5"
EXACT = {"Q8_0", "Q5_0", "Q5_1", "IQ4_NL", "IQ4_XS"}
K_QUANTS = {"Q4_K", "Q5_K", "Q6_K"}


def write(path, file_type):
    run = subprocess.run([BENCH, f"--model={MODEL}", f"--write_gguf={path}",
                          f"--type={file_type}", f"--threads={probe.THREADS}"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return path


def llama_quantize(source, path, file_type):
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{file_type}")
    params.nthread = probe.THREADS
    params.allow_requantize = True
    assert llama_cpp.llama_model_quantize(source.encode(), path.encode(),
                                          ctypes.byref(params)) == 0
    return path


@pytest.fixture(scope="module")
def directory(tmp_path_factory):
    return tmp_path_factory.mktemp("quantizer")


@pytest.fixture(scope="module")
def f32(directory):
    return write(str(directory / "f32.gguf"), "F32")


@pytest.fixture(scope="module")
def our_file(directory):
    """Our file of a file type, written once for all the tests that read it."""
    written = {}

    def file_of(file_type):
        if file_type not in written:
            written[file_type] = write(str(directory / f"ours-{file_type}.gguf"), file_type)
        return written[file_type]

    return file_of


def tensors(path):
    return {t.name: t for t in gguf_files.read(path).tensors}


@pytest.mark.parametrize("file_type",
                         ["Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "IQ4_XS", "BF16", "F16"])
def test_tensor_types_are_llama_quantizes(our_file, file_type):
    path = our_file(file_type)
    # The dry run logs each tensor; one it would convert gets "-> <type>".
    script = ("import ctypes, sys, llama_cpp\n"
              "p = llama_cpp.llama_model_quantize_default_params()\n"
              f"p.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_{file_type}\n"
              "p.allow_requantize = True\np.dry_run = True\np.nthread = 1\n"
              f"sys.exit(llama_cpp.llama_model_quantize({path!r}.encode(), b'unused', "
              "ctypes.byref(p)))\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    listed = [line for line in run.stderr.splitlines() if "type =" in line]
    assert len(listed) == len(tensors(path))
    converted = [line for line in listed if "->" in line]
    assert converted == []


@pytest.mark.parametrize("file_type", ["Q4_K_M", "Q5_K_M", "IQ4_XS"])
def test_blocks_match_or_beat_llama_cpps(directory, f32, our_file, file_type):
    ours = tensors(our_file(file_type))
    theirs = tensors(llama_quantize(f32, str(directory / f"llama-{file_type}.gguf"), file_type))
    weights = tensors(f32)
    seen = set()
    for name, mine in ours.items():
        ref = theirs[name]
        assert mine.tensor_type == ref.tensor_type, name
        kind = mine.tensor_type.name
        if kind == "F32":
            continue
        seen.add(kind)
        if kind in EXACT:
            assert np.array_equal(np.asarray(mine.data), np.asarray(ref.data)), name
            continue
        assert kind in K_QUANTS, name
        x = np.asarray(weights[name].data, dtype=np.float64).reshape(-1)
        a = gguf.quants.dequantize(mine.data, mine.tensor_type).reshape(-1)
        b = gguf.quants.dequantize(ref.data, ref.tensor_type).reshape(-1)
        ours_rms = np.sqrt(np.mean((a - x) ** 2))
        their_rms = np.sqrt(np.mean((b - x) ** 2))
        assert ours_rms <= 1.02 * their_rms, (name, ours_rms, their_rms)
    # What each mixture of this shape holds: 576-wide rows fall back from
    # 256-element blocks, the tied output is Q8_0; IQ4_XS keeps ffn_down Q5_K
    # in the first eighth of the layers (three query heads share a KV head
    # here, too few for its Q5_K values).
    assert seen == {"Q4_K_M": {"Q4_K", "Q5_0", "Q6_K", "Q8_0"},
                    "Q5_K_M": {"Q5_K", "Q5_1", "Q6_K", "Q8_0"},
                    "IQ4_XS": {"IQ4_XS", "IQ4_NL", "Q5_K", "Q8_0"}}[file_type]


def test_llama_cpp_runs_the_file_we_wrote(our_file):
    path = our_file("Q4_K_M")
    llm = llama_cpp.Llama(path, n_ctx=128, n_threads=probe.THREADS, verbose=False, logits_all=True)
    llm.eval(list(range(10, 42)))
    logits = np.array(llm.scores[:32])
    assert np.all(np.isfinite(logits))
    assert logits.std() > 0
