"""Writes a GGUF file of a published model's shape with random weights, in a
quantization llama.cpp's own quantizer makes (Q4_K_M by default), so that
Tandem and llama.cpp can be timed on the very same file at sizes whose real
weights cannot be downloaded here. See write-random-gguf.

The weights are random (normal, standard deviation 0.02; norms 1; a mixture
of experts' router standard normal), written as F16 to a temporary file beside the output and quantized with
llama_model_quantize (llama-quantize's per-tensor rules for the type). The
vocabulary and tokenizer are the default model's (49,152 tokens), so the
embedding and output projection are narrower than the named model's own
vocabulary (Llama 3.2: 128,256; Qwen2.5: 151,936). Outputs are noise."""
import argparse
import ctypes
import os

import gguf
import llama_cpp
import numpy as np

# hidden, layers, heads, KV heads, feed-forward, RoPE base, RMS epsilon,
# architecture (qwen2 adds q/k/v biases, qwen3 q/k norms and a head size of
# its own, phi3 fuses q/k/v and gate/up), head size (None: hidden / heads).
SHAPES = {
    "llama3.2-1b": (2048, 16, 32, 8, 8192, 500000.0, 1e-5, "llama", None),
    "llama3.2-3b": (3072, 28, 24, 8, 8192, 500000.0, 1e-5, "llama", None),
    "qwen2.5-1.5b": (1536, 28, 12, 2, 8960, 1000000.0, 1e-6, "qwen2", None),
    "qwen3-1.7b": (2048, 28, 16, 8, 6144, 1000000.0, 1e-6, "qwen3", 128),
    "qwen3-8b": (4096, 36, 32, 8, 12288, 1000000.0, 1e-6, "qwen3", 128),
    "phi3-mini": (3072, 32, 32, 32, 8192, 10000.0, 1e-5, "phi3", None),
    # The feed-forward width is each expert's.
    "olmoe-1b-7b": (2048, 16, 16, 16, 1024, 10000.0, 1e-5, "olmoe", None),
}
# Mixtures of experts: (experts, experts used a token).
EXPERTS = {"olmoe-1b-7b": (64, 8)}


def copy_tokenizer(reader, writer):
    for field in reader.fields.values():
        if not field.name.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub_type)


def write_f16(path, shape, vocab_model, seed, context):
    hidden, layers, heads, kv_heads, ffn, rope_base, eps, arch, head_dim = SHAPES[shape]
    head_dim = head_dim or hidden // heads
    q_width, kv_width = heads * head_dim, kv_heads * head_dim
    reader = gguf.GGUFReader(vocab_model)
    vocab = len(reader.fields["tokenizer.ggml.tokens"].contents())
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name(f"random {shape}")
    writer.add_context_length(context)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(rope_base)
    writer.add_layer_norm_rms_eps(eps)
    writer.add_rope_dimension_count(head_dim)
    if head_dim != hidden // heads:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_vocab_size(vocab)
    experts, experts_used = EXPERTS.get(shape, (0, 0))
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(experts_used)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    copy_tokenizer(reader, writer)
    rng = np.random.default_rng(seed)

    # (name, shape, dtype, make): the tensors in file order. They are streamed one
    # at a time (an 8B or a 7B mixture of experts is 14-16 GB in F16).
    tensors = []

    def matrix(name, *shape):
        tensors.append((name, shape, np.float16,
                        lambda: (rng.standard_normal(shape, dtype=np.float32) * 0.02)
                        .astype(np.float16)))

    def ones(name, n):
        tensors.append((name, (n,), np.float32, lambda: np.ones(n, dtype=np.float32)))

    def normal(name, n):
        tensors.append((name, (n,), np.float32,
                        lambda: rng.standard_normal(n, dtype=np.float32) * 0.02))

    matrix("token_embd.weight", vocab, hidden)
    for i in range(layers):
        b = f"blk.{i}."
        ones(b + "attn_norm.weight", hidden)
        if arch == "phi3":
            matrix(b + "attn_qkv.weight", q_width + 2 * kv_width, hidden)
        else:
            matrix(b + "attn_q.weight", q_width, hidden)
            matrix(b + "attn_k.weight", kv_width, hidden)
            matrix(b + "attn_v.weight", kv_width, hidden)
        if arch == "qwen2":
            for name, width in (("q", q_width), ("k", kv_width), ("v", kv_width)):
                normal(b + f"attn_{name}.bias", width)
        if arch == "qwen3":
            ones(b + "attn_q_norm.weight", head_dim)
            ones(b + "attn_k_norm.weight", head_dim)
        if arch == "olmoe":  # over the whole Q and K widths
            ones(b + "attn_q_norm.weight", q_width)
            ones(b + "attn_k_norm.weight", kv_width)
        matrix(b + "attn_output.weight", hidden, q_width)
        ones(b + "ffn_norm.weight", hidden)
        if experts:
            tensors.append((b + "ffn_gate_inp.weight", (experts, hidden), np.float32,
                            lambda: rng.standard_normal((experts, hidden), dtype=np.float32)))
            matrix(b + "ffn_gate_exps.weight", experts, ffn, hidden)
            matrix(b + "ffn_up_exps.weight", experts, ffn, hidden)
            matrix(b + "ffn_down_exps.weight", experts, hidden, ffn)
            continue
        if arch == "phi3":  # gate rows, then up rows
            matrix(b + "ffn_up.weight", 2 * ffn, hidden)
        else:
            matrix(b + "ffn_gate.weight", ffn, hidden)
            matrix(b + "ffn_up.weight", ffn, hidden)
        matrix(b + "ffn_down.weight", hidden, ffn)
    ones("output_norm.weight", hidden)
    if arch == "olmoe":  # llama.cpp's OLMoE wants its own output head
        matrix("output.weight", vocab, hidden)
    # (otherwise the output is tied to token_embd)
    for name, dims, dtype, _ in tensors:
        writer.add_tensor_info(name, dims, np.dtype(dtype),
                               int(np.prod(dims)) * np.dtype(dtype).itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, _, _, make in tensors:
        writer.write_tensor_data(make())
    writer.close()


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shape", default="llama3.2-1b", choices=sorted(SHAPES))
    p.add_argument("--type", default="Q4_K_M",
                   help="a llama.cpp file type: Q4_K_M, Q5_K_M, Q6_K, Q8_0, IQ4_XS, ...")
    p.add_argument("--out", required=True)
    p.add_argument("--vocab_model", required=True, help="GGUF whose tokenizer is copied")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{args.type}", None)
    if ftype is None:
        raise SystemExit(f"unknown --type {args.type!r} (a llama.cpp file type such as Q4_K_M)")
    f16 = args.out + ".f16.tmp"
    try:
        write_f16(f16, args.shape, args.vocab_model, args.seed, args.context)
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = ftype
        params.nthread = args.threads
        if llama_cpp.llama_model_quantize(f16.encode(), args.out.encode(),
                                          ctypes.byref(params)) != 0:
            raise SystemExit(f"llama_model_quantize failed for {args.out}")
    finally:
        if os.path.exists(f16):
            os.remove(f16)
    print(f"{args.out}: random {args.shape} as {args.type}, {os.path.getsize(args.out) >> 20} MiB")


if __name__ == "__main__":
    main()
