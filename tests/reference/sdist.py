"""llama.cpp's source distribution (llama-cpp-python's sdist, from PyPI): the
reference tests read the files it ships (chat templates, vocabulary GGUFs with
expected token ids). Downloaded once into the cache."""
import os
import subprocess
import sys

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
