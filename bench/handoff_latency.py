"""Handoff between daemons, measured: a prefill daemon hands each request to a
decode daemon (loopback, UCX over TCP) and the response's timeline says how
long the KV transfer (offer -> pages read -> lease released) and the whole
handoff took. Each request is sent in turn (the order rotating) to that pool,
to a unified daemon (whose handoff is a block-table move to its own decode
worker) and to a unified daemon whose decode worker keeps its KV in storage
of its own (--decode_kv_cache_bytes: the handoff moves the pages through the
same seam inside the daemon): medians with min and max, and the per-request
ratios of end-to-end time against the unified daemon.

Run by bench/handoff-latency (which builds nothing: it needs a build)."""
import argparse
import os
import random
import statistics
import sys
import time

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "e2e", "python"))
import tandem_e2e  # noqa: E402

pb2, pb2_grpc = tandem_e2e.generated_stubs()
BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 2  # SmolLM2-135M: K and V, 30 layers, 3 KV heads of 64, fp16
THRESHOLD = 8


def request(prompt_tokens, seed, extra_tokens):
    rng = random.Random(seed)
    return pb2.GenerateRequest(
        token_ids=[rng.randrange(500, 40000) for _ in range(prompt_tokens)],
        max_tokens=THRESHOLD + extra_tokens, ignore_eos=True, disable_speculation=True,
        sampling=pb2.SamplingParams(temperature=0.0))


def run(stub, r):
    start = time.perf_counter()
    last = None
    for message in stub.Generate(r, timeout=300):
        last = message
    return last, time.perf_counter() - start


def describe(values):
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompt_tokens", default="64,512,2048")
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--extra_tokens", type=int, default=24,
                        help="tokens generated after the handoff")
    args = parser.parse_args()
    common = ["--threads=1", f"--disagg_output_threshold={THRESHOLD}"]
    decode = tandem_e2e.Daemon("--role=decode", "--threads=1")
    decode.wait_serving()
    prefill = tandem_e2e.Daemon("--role=prefill", f"--decode_peers={decode.address}", *common)
    unified = tandem_e2e.Daemon(*common)
    separate = tandem_e2e.Daemon(*common, "--decode_kv_cache_bytes=536870912")
    daemons = (("pool", prefill), ("unified", unified), ("separate", separate))
    try:
        for _, d in daemons:
            d.wait_serving()
        stubs = {name: pb2_grpc.GenerationStub(grpc.insecure_channel(d.address))
                 for name, d in daemons}
        print("| prompt tokens | KV moved | kv_transfer ms, pool | GB/s | kv_transfer ms, "
              "separate storages | handoff ms, unified | request time pool / unified | "
              "separate / unified |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        names = [name for name, _ in daemons]
        for length in (int(x) for x in args.prompt_tokens.split(",")):
            transfer = {"pool": [], "separate": []}
            local, rates = [], []
            ratios = {"pool": [], "separate": []}
            blocks = (length + THRESHOLD - 1 + 15) // 16
            megabytes = blocks * 16 * BYTES_PER_TOKEN / 1e6
            for turn in range(args.pairs):
                order = names[turn % 3:] + names[:turn % 3]
                seconds = {}
                for name in order:
                    r = request(length, seed=length * 1000 + turn, extra_tokens=args.extra_tokens)
                    last, seconds[name] = run(stubs[name], r)
                    t = last.timeline
                    if name == "unified":
                        local.append(t.handoff_ms)
                        continue
                    expected = pb2.PATH_REMOTE if name == "pool" else pb2.PATH_DISAGGREGATED
                    assert last.path == expected, (name, last.path)
                    transfer[name].append(t.kv_transfer_ms)
                    if name == "pool":
                        rates.append(megabytes / t.kv_transfer_ms)  # MB/ms = GB/s
                for name in ratios:
                    ratios[name].append(seconds[name] / seconds["unified"])
            print(f"| {length} | {blocks} blocks, {megabytes:.1f} MB | "
                  f"{describe(transfer['pool'])} | {describe(rates)} | "
                  f"{describe(transfer['separate'])} | {describe(local)} | "
                  f"{describe(ratios['pool'])} | {describe(ratios['separate'])} |")
    finally:
        for _, d in daemons:
            d.kill()
        decode.kill()


if __name__ == "__main__":
    main()
