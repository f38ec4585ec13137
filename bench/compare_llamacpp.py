"""Runs tandem-bench and llama.cpp with the same prompt and threads; see
compare-llamacpp."""
import argparse
import statistics
import subprocess
import time

import llama_cpp
import numpy as np


def last_argmax(llm):
    logits = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return int(np.ctypeslib.as_array(logits, shape=(llm.n_vocab(),)).argmax())


def llama(model, threads, prompt_tokens, decode_tokens, repeats):
    prompt = [100 + (i * 7919) % 40000 for i in range(prompt_tokens)]  # as tandem-bench
    llm = llama_cpp.Llama(model, n_ctx=prompt_tokens + decode_tokens + 16, n_threads=threads,
                          n_threads_batch=threads, n_batch=prompt_tokens, verbose=False)
    prefill, decode = [], []
    for rep in range(repeats + 1):  # the first is a warm-up
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt)
        t1 = time.perf_counter()
        token = last_argmax(llm)
        for _ in range(decode_tokens):
            llm.eval([token])
            token = last_argmax(llm)
        t2 = time.perf_counter()
        if rep:
            prefill.append(prompt_tokens / (t1 - t0))
            decode.append(decode_tokens / (t2 - t1))
    return statistics.median(prefill), statistics.median(decode)


def tandem(bench, model, threads, prompt_tokens, decode_tokens, repeats, matmul):
    out = subprocess.run([bench, f"--model={model}", f"--threads={threads}",
                          f"--prompt_tokens={prompt_tokens}", f"--decode_tokens={decode_tokens}",
                          f"--repeats={repeats}", f"--cpu_matmul={matmul}"],
                         capture_output=True, text=True, check=True).stdout
    values = dict(line.split(" ", 1) for line in out.splitlines())
    return float(values["prefill_tokens_per_second"]), float(values["decode_tokens_per_second"])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bench", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt_tokens", type=int, default=512)
    p.add_argument("--decode_tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    print(f"batch 1, {a.threads} threads, prompt {a.prompt_tokens} tokens, "
          f"decode {a.decode_tokens} tokens, median of {a.repeats}")
    lp, ld = llama(a.model, a.threads, a.prompt_tokens, a.decode_tokens, a.repeats)
    print(f"{'':24s} {'prefill tok/s':>14s} {'decode tok/s':>13s}")
    print(f"{'llama.cpp ' + llama_cpp.__version__:24s} {lp:14.1f} {ld:13.1f}")
    for matmul in ("f32", "q8"):
        tp, td = tandem(a.bench, a.model, a.threads, a.prompt_tokens, a.decode_tokens,
                        a.repeats, matmul)
        print(f"{'tandem (' + matmul + ')':24s} {tp:14.1f} {td:13.1f}   "
              f"ratio vs llama.cpp: prefill {tp / lp:.2f}x, decode {td / ld:.2f}x")


if __name__ == "__main__":
    main()
