"""Tandem vs llama.cpp's llama-server, both serving the same model file on the
same cores, driven with the same token ids; see bench/compare-serving.

Each measure alternates the two servers pair by pair (A B A B ..., which one
goes first alternating too) and reports the median of the pairwise ratios
with their min and max: one-shot runs on these machines swing by 40%.

Measures:
  prefill   one request, a --prompt_tokens prompt: prompt tokens / TTFT
  decode    one request, --decode_tokens outputs: tokens after the first /
            time after the first
  serve N   N concurrent streams (closed loop, --rounds requests each) of a
            --serve_prompt_tokens prompt and --decode_tokens outputs:
            aggregate output tokens/s, and the inter-token p99
Every prompt starts at its own place in the text, so no prefix cache helps.
"""
import argparse
import http.client
import json
import os
import statistics
import sys
import threading
import time

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "e2e", "python"))
from tandem_e2e import generated_stubs  # noqa: E402

pb, pb_grpc = generated_stubs()


class Run:
    """One request's observation: when each token arrived."""

    def __init__(self):
        self.start = time.perf_counter()
        self.arrivals = []  # (time, tokens in that message)

    def tokens(self):
        return sum(n for _, n in self.arrivals)

    def ttft(self):
        return self.arrivals[0][0] - self.start

    def gaps(self):
        times = [t for t, _ in self.arrivals]
        return [b - a for a, b in zip(times, times[1:])]


def tandem_request(stub, ids, max_tokens):
    r = Run()
    request = pb.GenerateRequest(token_ids=ids, max_tokens=max_tokens, ignore_eos=True,
                                 sampling=pb.SamplingParams(temperature=0.0))
    for message in stub.Generate(request, timeout=600):
        if message.token_ids:
            r.arrivals.append((time.perf_counter(), len(message.token_ids)))
    return r


def llama_request(host, port, ids, max_tokens):
    r = Run()
    conn = http.client.HTTPConnection(host, port, timeout=600)
    body = json.dumps({"prompt": ids, "n_predict": max_tokens, "stream": True,
                       "temperature": 0.0, "ignore_eos": True, "cache_prompt": False})
    conn.request("POST", "/completion", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200, response.read()
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data: "):
            continue
        event = json.loads(line[6:])
        if event.get("stop"):
            break
        r.arrivals.append((time.perf_counter(), 1))
    conn.close()
    return r


class Peer:
    def __init__(self, name, request):
        self.name = name
        self.request = request  # (ids, max_tokens) -> Run


def prompts(stub, text_file, count, length):
    """`count` prompts of exactly `length` token ids, each from its own offset."""
    with open(text_file, encoding="utf-8") as f:
        ids = list(stub.Tokenize(pb.TokenizeRequest(text=f.read())).token_ids)
    assert len(ids) >= length + 37 * count, "the text is too short for these prompts"
    return [ids[37 * k: 37 * k + length] for k in range(count)]


def serve(peer, prompt_ids, streams, rounds, max_tokens):
    """Closed loop: `streams` clients, `rounds` requests each."""
    runs, lock = [], threading.Lock()

    def client(c):
        for k in range(rounds):
            run = peer.request(prompt_ids[(c * rounds + k) % len(prompt_ids)], max_tokens)
            with lock:
                runs.append(run)

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    gaps = sorted(g for r in runs for g in r.gaps())
    return sum(r.tokens() for r in runs) / wall, gaps[int(0.99 * (len(gaps) - 1))] * 1000


def pairwise(name, peers, pairs, measure, unit, higher_is_better=True):
    values = {p.name: [] for p in peers}
    for i in range(pairs):
        order = peers if i % 2 == 0 else peers[::-1]
        for p in order:
            values[p.name].append(measure(p, i))
    a, b = (values[p.name] for p in peers)
    ratios = sorted(x / y for x, y in zip(a, b))
    print(f"{name:22s} {peers[0].name} {statistics.median(a):8.1f}  {peers[1].name} "
          f"{statistics.median(b):8.1f} {unit:6s}  ratio median {statistics.median(ratios):.2f}x "
          f"(min {ratios[0]:.2f}, max {ratios[-1]:.2f}, {pairs} pairs)", flush=True)
    return statistics.median(a)


def model_costs(model_file):
    """(multiply-adds per token of the layers, bytes of weights read per decode step).

    The layers' 2-D tensors run for every token; the output projection (the
    tied embedding when the file has no output.weight) only where a token is
    sampled, once per sequence per step."""
    import gguf
    reader = gguf.GGUFReader(model_file)
    layer_macs, layer_bytes, head = 0, 0, {}
    for t in reader.tensors:
        if len(t.shape) < 2:
            continue
        if t.name.startswith("blk."):
            layer_macs += int(t.n_elements)
            layer_bytes += int(t.n_bytes)
        elif t.name in ("output.weight", "token_embd.weight"):
            head[t.name] = (int(t.n_elements), int(t.n_bytes))
    head_macs, head_bytes = head.get("output.weight", head["token_embd.weight"])
    return layer_macs, head_macs, layer_bytes + head_bytes


def read_roofline(binary):
    import subprocess
    out = subprocess.run([binary], capture_output=True, text=True, check=True).stdout
    return {k: float(v) for k, v in (line.split() for line in out.splitlines())}


def print_bounds(a, stub, measured):
    """How close tandem's medians are to this machine's own limits."""
    roof = read_roofline(a.roofline)
    layer_macs, head_macs, step_bytes = model_costs(a.model)
    matmul = a.matmul
    if matmul == "auto":  # as this tandemd resolved it: GetLoad's "cpu-ISA/MODE/rN"
        matmul = stub.GetLoad(pb.GetLoadRequest(), timeout=10).arithmetic.split("/")[1]
    # Each mode's products: q8 multiplies 8-bit integers (VNNI dot products, or
    # AVX2's vpmaddubsw), q16 two of them per product (one per digit).
    peak_of = {"bf16": ("bf16_dot_gflops", 1), "q8": ("int8_dot_gops", 1),
               "q16": ("int8_dot_gops", 2)}
    key, dots = peak_of.get(matmul, ("fp32_fma_gflops", 1))
    # Without the instructions the mode falls back to float32 panels.
    peak = (roof[key] / dots if key in roof else roof["fp32_fma_gflops"]) * 1e9
    bandwidth = roof["read_bandwidth_gbs"] * 1e9
    print(f"bounds measured on this machine (tandem-roofline, {int(roof['threads'])} threads): "
          f"fp32 FMA {roof['fp32_fma_gflops']:.0f} GFLOP/s, bf16 dot "
          f"{roof.get('bf16_dot_gflops', 0):.0f} GFLOP/s, int8 dot "
          f"{roof.get('int8_dot_gops', 0):.0f} GOP/s, read {roof['read_bandwidth_gbs']:.1f} "
          f"GB/s; the model: {2 * layer_macs / 1e6:.0f} MFLOP per token in its layers, "
          f"{step_bytes / 1e6:.0f} MB of weights per decode step; peak used: {matmul}")

    def line(name, value, bound, limit):
        print(f"{name:22s} tandem {value:8.1f} tok/s = {100 * value / bound:4.0f}% of the "
              f"{limit} bound {bound:8.1f} tok/s", flush=True)

    line("prefill", measured["prefill"], peak / (2 * layer_macs), "compute")
    line("decode (batch 1)", measured["decode"], bandwidth / step_bytes, "bandwidth")
    for name, value in measured.items():
        if not name.startswith("serve "):
            continue
        n = int(name.split()[1])
        # A step of n sequences: n tokens of compute (layers and head), one
        # read of the weights; whichever takes longer bounds it.
        step = max(n * 2 * (layer_macs + head_macs) / peak, step_bytes / bandwidth)
        line(name, value, n / step, "compute" if n * 2 * (layer_macs + head_macs) / peak >
             step_bytes / bandwidth else "bandwidth")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tandem", required=True, help="tandemd gRPC address")
    ap.add_argument("--llama", required=True, help="llama-server host:port")
    ap.add_argument("--text", required=True, help="a text file the prompts are cut from")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--prompt_tokens", type=int, default=512)
    ap.add_argument("--decode_tokens", type=int, default=128)
    ap.add_argument("--serve_prompt_tokens", type=int, default=64)
    ap.add_argument("--streams", default="1,8,32")
    ap.add_argument("--rounds", type=int, default=2, help="requests per stream per run")
    ap.add_argument("--roofline", help="tandem-roofline binary: print the machine's bounds")
    ap.add_argument("--model", help="the GGUF file (for the bounds)")
    ap.add_argument("--matmul", default="auto", help="tandemd's CPU matmul mode (for the bounds)")
    a = ap.parse_args()

    stub = pb_grpc.GenerationStub(grpc.insecure_channel(a.tandem))
    host, port = a.llama.rsplit(":", 1)
    peers = [Peer("tandem", lambda ids, n: tandem_request(stub, ids, n)),
             Peer("llama-server", lambda ids, n: llama_request(host, int(port), ids, n))]
    streams = [int(s) for s in a.streams.split(",") if s]
    needed = max([2 * a.pairs + 2] + [s * a.rounds for s in streams])
    long_prompts = prompts(stub, a.text, 2 * a.pairs + 2, a.prompt_tokens)
    short_prompts = prompts(stub, a.text, needed, a.serve_prompt_tokens)
    for p in peers:  # warm both up (page in weights, first allocations)
        p.request(long_prompts[-1], 4)

    print(f"same model file, same cores; prompts of {a.prompt_tokens} tokens (prefill, decode) "
          f"and {a.serve_prompt_tokens} (serving), {a.decode_tokens} output tokens, greedy")
    next_prompt = {p.name: 0 for p in peers}

    def fresh(p):
        k = next_prompt[p.name]
        next_prompt[p.name] += 1
        return long_prompts[k]

    single = {}

    def one(p, i):
        run = p.request(fresh(p), a.decode_tokens)
        single[(p.name, i)] = run
        return a.prompt_tokens / run.ttft()

    measured = {}
    measured["prefill"] = pairwise("prefill", peers, a.pairs, one, "tok/s")
    measured["decode"] = pairwise("decode (batch 1)", peers, a.pairs,
             lambda p, i: (single[(p.name, i)].tokens() - 1) /
             (single[(p.name, i)].arrivals[-1][0] - single[(p.name, i)].arrivals[0][0]), "tok/s")
    for s in streams:
        p99 = {}

        def measure(p, i, s=s):
            rate, itl = serve(p, short_prompts, s, a.rounds, a.decode_tokens)
            p99.setdefault(p.name, []).append(itl)
            return rate

        measured[f"serve {s} streams"] = pairwise(f"serve {s} streams", peers, a.pairs, measure,
                                                  "tok/s")
        print(f"{'':22s} inter-token p99 (median of runs): tandem "
              f"{statistics.median(p99['tandem']):.0f} ms, llama-server "
              f"{statistics.median(p99['llama-server']):.0f} ms", flush=True)
    if a.roofline and a.model:
        print_bounds(a, stub, measured)


if __name__ == "__main__":
    main()
