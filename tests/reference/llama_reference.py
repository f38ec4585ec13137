"""llama.cpp (through llama-cpp-python) as the independent reference for
logits and greedy decoding on the same GGUF file."""
import functools

import numpy as np

import probe


@functools.lru_cache(maxsize=1)
def model(n_ctx=1024):
    import llama_cpp
    return llama_cpp.Llama(probe.MODEL, n_ctx=n_ctx, n_threads=probe.THREADS,
                           n_threads_batch=probe.THREADS,
                           logits_all=True, verbose=False)


def logits(tokens, positions=1):
    """Logits of the last `positions` positions of `tokens`: [positions, vocab]."""
    llm = model()
    llm.reset()
    llm.eval(tokens)
    n = len(tokens)
    return np.array(llm.scores[n - positions:n], dtype=np.float64)


def greedy(tokens, count):
    llm = model()
    llm.reset()
    out = []
    for t in llm.generate(tokens, temp=0.0, top_k=1, reset=True):
        out.append(int(t))
        if len(out) == count:
            break
    return out
