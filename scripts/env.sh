# Shared settings for the scripts (sourced, not run).
# TANDEM_CACHE      downloads, the Python virtual environment (default ~/.cache/tandem)
# TANDEM_MODEL_DIR  where the default model is cached (default models/ in the checkout)
# TANDEM_BUILD_DIR  the CMake build directory (default build/ in the checkout)
# TANDEM_JOBS       parallel compile jobs and ctest jobs (default: the CPUs here)
TANDEM_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TANDEM_CACHE="${TANDEM_CACHE:-$HOME/.cache/tandem}"
TANDEM_MODEL_DIR="${TANDEM_MODEL_DIR:-$TANDEM_ROOT/models}"
TANDEM_BUILD_DIR="${TANDEM_BUILD_DIR:-$TANDEM_ROOT/build}"
TANDEM_VENV="$TANDEM_CACHE/venv"
TANDEM_MODEL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
TANDEM_JOBS="${TANDEM_JOBS:-$(nproc)}"
export TANDEM_CACHE TANDEM_MODEL_DIR TANDEM_BUILD_DIR TANDEM_JOBS
# ccache keeps rebuilds of a fresh clone fast, wherever it is cloned: paths
# under the checkout are hashed relative to it (BASEDIR), and the working
# directory is left out of the hash of -g builds (NOHASHDIR).
export CCACHE_DIR="${CCACHE_DIR:-$TANDEM_CACHE/ccache}"
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$TANDEM_ROOT}"
export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"

# llama.cpp (the reference tests' and benchmarks' peer) is built for this
# CPU, less its AMX kernels: -march=native turns them on on Sapphire Rapids
# and later Xeons, where llama-cpp-python 0.3.36 segfaults in its first
# evaluation (seen here; ggml-org/llama.cpp#20824 reports the same crash in
# ggml_backend_amx_mul_mat). Explicit -mno- flags win over -march=native.
TANDEM_LLAMA_CPP_CFLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"

tandem_log() { printf '\033[1m[tandem]\033[0m %s\n' "$*" >&2; }
