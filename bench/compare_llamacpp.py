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


def load_llama(model, threads, prompt_tokens, decode_tokens):
    """Loads the file once for the whole run (no run times the load; loading
    a 4-8 GB file again for every pair only made the run longer)."""
    started = time.perf_counter()
    llm = llama_cpp.Llama(model, n_ctx=prompt_tokens + decode_tokens + 16, n_threads=threads,
                          n_threads_batch=threads, n_batch=prompt_tokens, verbose=False)
    print(f"llama.cpp loaded the file in {time.perf_counter() - started:.1f} s", flush=True)
    return llm


def llama(llm, prompt_tokens, decode_tokens, repeats):
    prompt = [100 + (i * 7919) % 40000 for i in range(prompt_tokens)]  # as tandem-bench
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
                          f"--prompt_tokens={prompt_tokens}", f"--decode_context={prompt_tokens}",
                          f"--decode_tokens={decode_tokens}",
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
    p.add_argument("--repeats", type=int, default=1, help="timed runs per engine per pair")
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--modes", default="bf16,f32,q8", help="tandem CPU matmul modes")
    a = p.parse_args()
    modes = a.modes.split(",")
    print(f"batch 1, {a.threads} threads, prompt {a.prompt_tokens} tokens, "
          f"decode {a.decode_tokens} tokens; {a.pairs} pairs, llama.cpp and each tandem mode "
          "alternating (A B, then B A), median of the pairwise ratios (min, max)")
    runs = {name: [] for name in ["llama.cpp"] + modes}
    llm = load_llama(a.model, a.threads, a.prompt_tokens, a.decode_tokens)

    def measure(name):
        if name == "llama.cpp":
            return llama(llm, a.prompt_tokens, a.decode_tokens, a.repeats)
        return tandem(a.bench, a.model, a.threads, a.prompt_tokens, a.decode_tokens, a.repeats,
                      name)

    for i in range(a.pairs):
        for mode in modes:
            order = ["llama.cpp", mode] if i % 2 == 0 else [mode, "llama.cpp"]
            for name in order:
                runs[name].append(measure(name))
    peer = runs["llama.cpp"]  # two per pair and mode, in order: pair i, mode m
    print(f"{'':24s} {'prefill tok/s':>14s} {'decode tok/s':>13s}   ratio vs llama.cpp")
    lp = statistics.median(r[0] for r in peer)
    ld = statistics.median(r[1] for r in peer)
    print(f"{'llama.cpp ' + llama_cpp.__version__:24s} {lp:14.1f} {ld:13.1f}")
    for m, mode in enumerate(modes):
        mine = runs[mode]
        theirs = [peer[i * len(modes) + m] for i in range(a.pairs)]
        pre = sorted(x[0] / y[0] for x, y in zip(mine, theirs))
        dec = sorted(x[1] / y[1] for x, y in zip(mine, theirs))
        print(f"{'tandem (' + mode + ')':24s} {statistics.median(r[0] for r in mine):14.1f} "
              f"{statistics.median(r[1] for r in mine):13.1f}   prefill "
              f"{statistics.median(pre):.2f}x ({pre[0]:.2f}, {pre[-1]:.2f}), decode "
              f"{statistics.median(dec):.2f}x ({dec[0]:.2f}, {dec[-1]:.2f})")


if __name__ == "__main__":
    main()
