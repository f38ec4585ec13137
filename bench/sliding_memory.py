"""Resident memory of a long request on a model with sliding-window layers:
tandemd with its sliding layers' pages given back (the default) and kept
(--release_sliding_kv=false), and optionally llama.cpp's llama-server, on
the same file and the same prompt of token ids.

The file is a random-weight Gemma 3 of Gemma 3 1B's KV shape (26 layers,
five sliding of every six with a window of 512, one KV head of 256) and a
narrower feed-forward, written once by tests/reference/random_models.py into
the cache directory. Each server gets one warm-up request, then one request
of --prompt_tokens random token ids and --max_tokens greedy tokens; the
report gives VmRSS when ready and after the request, their difference (the
KV the request left resident, plus whatever else grew) and the peak.
"""
import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))

SHAPE = dict(layers=26, embedding=1152, heads=4, kv_heads=1, head_dim=256, ffn=1536,
             context=32768, rope_base=1000000.0, eps=1e-6, window=512)


def model_file(cache):
    path = os.path.join(cache, "bench", "random-gemma3-kv1b.gguf")
    if not os.path.exists(path):
        import random_models
        os.makedirs(os.path.dirname(path), exist_ok=True)
        random_models.CONFIGS["gemma3"] = SHAPE  # this shape under the family's name
        tmp = path + ".tmp"
        random_models.write(tmp, "gemma3", seed=11)
        os.replace(tmp, path)
    return path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def post(url, body, timeout=1200):
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)


def wait_ok(url, process, timeout=600):
    end = time.time() + timeout
    while time.time() < end:
        if process.poll() is not None:
            raise RuntimeError(f"{url}: the server exited")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(url)


def measure(name, command, port, completion, prompt, max_tokens):
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ok(f"http://127.0.0.1:{port}/health", process)
        completion([prompt[0]], 1)
        ready = rss_kib(process.pid, "VmRSS")
        start = time.time()
        completion(prompt, max_tokens)
        seconds = time.time() - start
        after = rss_kib(process.pid, "VmRSS")
        peak = rss_kib(process.pid, "VmHWM")
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
    print(f"{name}: ready {ready // 1024} MiB, after the request {after // 1024} MiB "
          f"(+{(after - ready) // 1024} MiB), peak {peak // 1024} MiB; the request took "
          f"{seconds:.1f} s", flush=True)
    return after - ready


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tandemd", required=True, help="the tandemd binary")
    parser.add_argument("--llama_server", default="", help="llama-server binary (optional)")
    parser.add_argument("--prompt_tokens", type=int, default=8000)
    parser.add_argument("--max_tokens", type=int, default=32)
    parser.add_argument("--cache", default=os.environ.get("TANDEM_CACHE", "/tmp"))
    args = parser.parse_args()
    path = model_file(args.cache)
    rng = random.Random(20261206)
    prompt = [rng.randrange(300, 30000) for _ in range(args.prompt_tokens)]
    context = args.prompt_tokens + args.max_tokens + 64
    kv_layer_kib = 2 * SHAPE["kv_heads"] * SHAPE["head_dim"] * 2 / 1024  # K and V, a position
    sliding = sum(1 for i in range(SHAPE["layers"]) if i % 6 < 5)
    print(f"{path}: {SHAPE['layers']} layers ({sliding} sliding, window {SHAPE['window']}), "
          f"KV {kv_layer_kib * SHAPE['layers']:.0f} KiB a position in all; a prompt of "
          f"{args.prompt_tokens} token ids, {args.max_tokens} greedy tokens", flush=True)
    full = kv_layer_kib * SHAPE["layers"] * context / 1024
    windowed = kv_layer_kib * ((SHAPE["layers"] - sliding) * context +
                               sliding * (SHAPE["window"] + 16)) / 1024
    print(f"KV of every position: {full:.0f} MiB; with sliding layers at their window: "
          f"{windowed:.0f} MiB", flush=True)
    for release in ("true", "false"):
        port = free_port()

        def completion(ids, tokens, port=port):
            base = f"http://127.0.0.1:{port}/v1"
            with urllib.request.urlopen(f"{base}/models", timeout=60) as response:
                model = json.load(response)["data"][0]["id"]
            post(f"{base}/completions",
                 {"model": model, "prompt": ids, "max_tokens": tokens, "temperature": 0})

        measure(f"tandemd --release_sliding_kv={release}",
                [args.tandemd, f"--model={path}", f"--listen=127.0.0.1:{free_port()}",
                 f"--metrics_listen=127.0.0.1:{free_port()}", f"--http_port={port}",
                 f"--context_length={context}", "--speculative=off",
                 f"--release_sliding_kv={release}"],
                port, completion, prompt, args.max_tokens)
    if args.llama_server:
        port = free_port()

        def completion(ids, tokens):
            post(f"http://127.0.0.1:{port}/completion",
                 {"prompt": ids, "n_predict": tokens, "temperature": 0, "cache_prompt": False})

        measure("llama-server", [args.llama_server, "-m", path, "--host", "127.0.0.1",
                                 "--port", str(port), "-t", "2", "-tb", "2", "-np", "1",
                                 "-c", str(context)],
                port, completion, prompt, args.max_tokens)


if __name__ == "__main__":
    main()
