"""Runs tandem-probe (our engine) for the reference tests.

The tests compare our outputs with independent implementations: Hugging Face
`tokenizers`, the `gguf` package, jinja2 rendering the model's own template,
and llama.cpp through `llama-cpp-python`. Paths come from the environment
that ctest sets: TANDEM_PROBE (the probe binary) and TANDEM_TEST_MODEL.
"""
import contextlib
import os
import subprocess
import tempfile

import numpy as np

PROBE = os.environ.get("TANDEM_PROBE", "build/bin/tandem-probe")
MODEL = os.environ.get("TANDEM_TEST_MODEL", "models/SmolLM2-135M-Instruct.Q4_1.gguf")
# Compute threads of the probe and of llama.cpp: the CPUs per ctest job
# (scripts/test sets TANDEM_TEST_THREADS: 1 on a 2-core machine at -j2),
# else 2. Two tests side by side that each compute on both CPUs wait on each
# other's preempted threads: 220 s against 57-80 s on one thread each.
THREADS = max(0, int(os.environ.get("TANDEM_TEST_THREADS") or 0)) or 2


@contextlib.contextmanager
def using_model(path):
    """Runs the probe on another GGUF file (a vocabulary, a random model) inside the block."""
    global MODEL
    saved, MODEL = MODEL, path
    try:
        yield
    finally:
        MODEL = saved


_MATMUL_SUPPORT = {}


def supports_matmul(mode):
    """Whether this build's CPU kernels run --matmul=MODE: bf16 needs AVX-512
    BF16 instructions, which not every x86-64 machine has."""
    if mode not in _MATMUL_SUPPORT:
        with tempfile.NamedTemporaryFile(suffix=".bin") as f:
            out = subprocess.run([PROBE, "logits", f"--model={MODEL}", f"--matmul={mode}",
                                  f"--out={f.name}"], input="1\n", capture_output=True,
                                 text=True, check=False)
        unsupported = out.returncode != 0 and "target CPU lacks" in out.stderr
        if out.returncode != 0 and not unsupported:
            raise RuntimeError(f"tandem-probe logits failed: {out.stderr}")
        _MATMUL_SUPPORT[mode] = not unsupported
    return _MATMUL_SUPPORT[mode]


def auto_matmul():
    """The mode --cpu_matmul=auto chooses on this CPU (f32, q16 or bf16)."""
    out = subprocess.run([PROBE, "matmul-mode", "--matmul=auto"], capture_output=True,
                         text=True, check=True)
    return out.stdout.strip()


def require_matmul(mode):
    """Skips the calling test where this build cannot run --matmul=MODE."""
    import pytest
    if not supports_matmul(mode):
        pytest.skip(f"--matmul={mode} needs instructions this machine's CPU lacks")


def run(command, lines, *flags):
    """Runs a probe subcommand with one input line per item; returns stdout lines."""
    out = subprocess.run(
        [PROBE, command, f"--model={MODEL}", f"--threads={THREADS}", *flags],
        input="".join(line + "\n" for line in lines),
        capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"tandem-probe {command} failed: {out.stderr}")
    return out.stdout.splitlines()


def tokenize(texts, parse_special=True):
    lines = run("tokenize", [t.encode("utf-8", "surrogatepass").hex() for t in texts],
                f"--parse_special={str(parse_special).lower()}")
    return [[int(x) for x in line.split()] for line in lines]


def detokenize(id_lists):
    lines = run("detokenize", [" ".join(map(str, ids)) for ids in id_lists])
    return [bytes.fromhex(line) for line in lines]


def stream_detokenize(id_lists):
    """The text chunks emitted after each token, plus the final flush, as bytes."""
    lines = run("stream-detokenize", [" ".join(map(str, ids)) for ids in id_lists])
    return [[bytes.fromhex(chunk) for chunk in line.split(" ")] for line in lines]


def pretokenize(texts, kind):
    lines = run("pretokenize", [t.encode().hex() for t in texts], f"--pretokenizer={kind}")
    return [[bytes.fromhex(p).decode() for p in line.split()] for line in lines]


def chat(conversations, template=""):
    """Renders conversations ([(role, content)...]); returns (text, token ids) each."""
    lines = [",".join(r.encode().hex() + ":" + c.encode().hex() for r, c in conv)
             for conv in conversations]
    out = []
    for line in run("chat", lines, f"--chat_template={template}"):
        text_hex, _, ids = line.partition("\t")
        out.append((bytes.fromhex(text_hex).decode(), [int(x) for x in ids.split()]))
    return out


def logits(prompts, *flags):
    """Last-position logits for each prompt (lists of token ids): [n, vocab]."""
    with tempfile.NamedTemporaryFile(suffix=".bin") as f:
        run("logits", [" ".join(map(str, p)) for p in prompts], f"--out={f.name}", *flags)
        return np.fromfile(f.name, dtype=np.float32).reshape(len(prompts), -1)


def generate(prompts, max_tokens, *flags):
    lines = run("generate", [" ".join(map(str, p)) for p in prompts],
                f"--max_tokens={max_tokens}", *flags)
    return [[int(x) for x in line.split()] for line in lines]


def dequantize(model, tensor):
    with tempfile.NamedTemporaryFile(suffix=".bin") as f:
        subprocess.run([PROBE, "dequantize", f"--model={model}", f"--tensor={tensor}",
                        f"--out={f.name}"], check=True, capture_output=True)
        return np.fromfile(f.name, dtype=np.float32)
