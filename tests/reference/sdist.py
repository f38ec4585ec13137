"""llama.cpp's source distribution (llama-cpp-python's sdist, from PyPI): the
reference tests read the files it ships (chat templates, vocabulary GGUFs with
expected token ids). Downloaded once into the cache."""
import functools
import os
import subprocess
import sys
import tarfile
import tempfile

VERSION = "0.3.36"
NAME = f"llama_cpp_python-{VERSION}.tar.gz"


def path():
    cache = os.environ.get("TANDEM_CACHE", os.path.expanduser("~/.cache/tandem"))
    directory = os.path.join(cache, "downloads", "sdist")
    archive = os.path.join(directory, NAME)
    if not os.path.exists(archive):
        os.makedirs(directory, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--no-binary", ":all:", "--dest", directory,
                        f"llama-cpp-python=={VERSION}"],
                       check=True)
    return archive


@functools.lru_cache(maxsize=1)
def vocab_dir():
    """llama.cpp's vocabulary-only GGUFs (vendor/llama.cpp/models/ggml-vocab-*),
    with their test inputs and expected ids, extracted once; returns the directory."""
    out = tempfile.mkdtemp(prefix="tandem-vocab-")
    with tarfile.open(path()) as tar:
        for member in tar.getmembers():
            name = os.path.basename(member.name)
            if "vendor/llama.cpp/models/" in member.name and name.startswith("ggml-vocab-"):
                member.name = name
                tar.extract(member, out)
    return out


def vocab_file(name):
    """The vocabulary GGUF of `name` (llama-spm, qwen2, phi-3, ...)."""
    return os.path.join(vocab_dir(), f"ggml-vocab-{name}.gguf")
