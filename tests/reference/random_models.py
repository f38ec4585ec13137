"""Random-weight GGUF files of the model families we load, small enough for
the reference tests: the file layout llama.cpp's converter writes for each
family (tensor names, metadata keys, Q/K row order, fused tensors) with
seeded random weights, and a tokenizer of the family where llama.cpp's
sdist has one (Phi-3's SentencePiece vocabulary), the default model's
otherwise. Both our engine and the references (numpy_reference.py,
llama.cpp) read the very same file."""
import gguf
import numpy as np

import gguf_files
import probe
import sdist

# A small config of each family. Qwen3's head size is its own (not
# embedding / heads), as in the published models.
CONFIGS = {
    # Q/K/V biases; Qwen2's own vocabulary.
    "qwen2": dict(layers=2, embedding=256, heads=4, kv_heads=2, head_dim=64, ffn=768,
                  context=512, rope_base=1000000.0, eps=1e-6, biases=True, vocab="qwen2"),
    "qwen3": dict(layers=2, embedding=256, heads=4, kv_heads=2, head_dim=128, ffn=768,
                  context=512, rope_base=1000000.0, eps=1e-6),
    # Fused attn_qkv and gate-and-up ffn_up; Phi-3's vocabulary.
    "phi3": dict(layers=2, embedding=256, heads=4, kv_heads=4, head_dim=64, ffn=512,
                 context=512, rope_base=10000.0, eps=1e-5, fused=True, vocab="phi-3"),
    # Post-norms, GELU, embedding scale; sliding-window layers (every other
    # one) with a window shorter than the prompt, and soft-capping tighter
    # than the published 50 / 30 so that both change the results.
    "gemma2": dict(layers=2, embedding=256, heads=4, kv_heads=2, head_dim=64, ffn=512,
                   context=512, rope_base=10000.0, eps=1e-6, window=6, attn_softcap=4.0,
                   final_softcap=15.0),
    # Gemma 3 4B's layout: five sliding layers (base 10,000) then a global one
    # (base 1,000,000, linear scaling by 8), Q/K norms, one KV head, a head
    # size of its own.
    "gemma3": dict(layers=6, embedding=256, heads=4, kv_heads=1, head_dim=128, ffn=512,
                   context=512, rope_base=1000000.0, eps=1e-6, window=6, rope_linear=8.0),
    # Experts: 8, of which each token uses 2 (Qwen3-MoE renormalises their
    # weights; OLMoE does not, and norms Q and K over their whole width).
    "qwen3moe": dict(layers=2, embedding=256, heads=4, kv_heads=2, head_dim=64, ffn=768,
                     context=512, rope_base=1000000.0, eps=1e-6, experts=8, experts_used=2,
                     expert_ffn=128),
    # OLMoE's output head is its own tensor (llama.cpp requires one).
    "olmoe": dict(layers=2, embedding=256, heads=4, kv_heads=4, head_dim=64, ffn=128,
                  context=512, rope_base=10000.0, eps=1e-5, experts=8, experts_used=2,
                  untied=True),
}


def write(path, arch, seed=0):
    """`arch`: a family of CONFIGS, or FAMILY-bf16 for its matrices in BF16
    (what converters write for bfloat16 checkpoints) instead of F16."""
    arch, _, matrices = arch.partition("-")
    c = CONFIGS[arch]
    rng = np.random.default_rng(seed)
    source = gguf_files.read(sdist.vocab_file(c["vocab"]) if "vocab" in c else probe.MODEL)
    vocab = len(source.fields["tokenizer.ggml.tokens"].data)
    writer = gguf.GGUFWriter(path, arch)
    if matrices == "bf16":  # every F16 tensor below becomes BF16
        add_tensor = writer.add_tensor

        def add_bf16(name, values, **kwargs):
            if values.dtype != np.float16:
                return add_tensor(name, values, **kwargs)
            kind = gguf.GGMLQuantizationType.BF16
            return add_tensor(name, gguf.quants.quantize(values.astype(np.float32), kind),
                              raw_dtype=kind)
        writer.add_tensor = add_bf16
    writer.add_name(f"random-{arch}")
    writer.add_block_count(c["layers"])
    writer.add_context_length(c["context"])
    writer.add_embedding_length(c["embedding"])
    writer.add_feed_forward_length(c["ffn"])
    writer.add_head_count(c["heads"])
    writer.add_head_count_kv(c["kv_heads"])
    writer.add_key_length(c["head_dim"])
    writer.add_value_length(c["head_dim"])
    writer.add_rope_freq_base(c["rope_base"])
    writer.add_rope_dimension_count(c["head_dim"])
    writer.add_layer_norm_rms_eps(c["eps"])
    if "window" in c:
        writer.add_sliding_window(c["window"])
    if "attn_softcap" in c:
        writer.add_attn_logit_softcapping(c["attn_softcap"])
    if "final_softcap" in c:
        writer.add_final_logit_softcapping(c["final_softcap"])
    if "experts" in c:
        writer.add_expert_count(c["experts"])
        writer.add_expert_used_count(c["experts_used"])
        if "expert_ffn" in c:
            writer.add_expert_feed_forward_length(c["expert_ffn"])
    if "rope_linear" in c:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(c["rope_linear"])
    for field in source.fields.values():
        if field.name.startswith("tokenizer."):
            vtype = field.types[0]
            sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub_type)

    def matrix(rows, cols):  # [out][in], F16 as converted Hugging Face models are
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float16)

    def norm(width):  # learned norms sit around 1
        return (1.0 + 0.2 * rng.standard_normal(width)).astype(np.float32)

    q_width, kv_width = c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"]
    # Tied output: logits of a spread real models have (std ~2.4, not ~16).
    writer.add_tensor("token_embd.weight",
                      (0.15 * rng.standard_normal((vocab, c["embedding"]))).astype(np.float16))
    writer.add_tensor("output_norm.weight", norm(c["embedding"]))
    if c.get("untied"):
        writer.add_tensor("output.weight",
                          (0.15 * rng.standard_normal((vocab, c["embedding"]))).astype(np.float16))
    for i in range(c["layers"]):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", norm(c["embedding"]))
        if c.get("fused"):  # rows Q, then K, then V
            writer.add_tensor(p + "attn_qkv.weight", matrix(q_width + 2 * kv_width, c["embedding"]))
        else:
            writer.add_tensor(p + "attn_q.weight", matrix(q_width, c["embedding"]))
            writer.add_tensor(p + "attn_k.weight", matrix(kv_width, c["embedding"]))
            writer.add_tensor(p + "attn_v.weight", matrix(kv_width, c["embedding"]))
        if c.get("biases"):
            for name, width in (("q", q_width), ("k", kv_width), ("v", kv_width)):
                writer.add_tensor(p + f"attn_{name}.bias",
                                  (0.5 * rng.standard_normal(width)).astype(np.float32))
        if arch in ("qwen3", "gemma3", "qwen3moe"):
            writer.add_tensor(p + "attn_q_norm.weight", norm(c["head_dim"]))
            writer.add_tensor(p + "attn_k_norm.weight", norm(c["head_dim"]))
        if arch == "olmoe":  # over the whole width
            writer.add_tensor(p + "attn_q_norm.weight", norm(q_width))
            writer.add_tensor(p + "attn_k_norm.weight", norm(kv_width))
        writer.add_tensor(p + "attn_output.weight", matrix(c["embedding"], q_width))
        if arch.startswith("gemma"):
            writer.add_tensor(p + "post_attention_norm.weight", norm(c["embedding"]))
            writer.add_tensor(p + "post_ffw_norm.weight", norm(c["embedding"]))
        writer.add_tensor(p + "ffn_norm.weight", norm(c["embedding"]))
        if "experts" in c:  # [expert][out][in]; the router in F32, as llama-quantize keeps it
            width = c.get("expert_ffn", c["ffn"])
            experts = c["experts"]
            writer.add_tensor(p + "ffn_gate_inp.weight",
                              matrix(experts, c["embedding"]).astype(np.float32))
            for name, rows, cols in (("gate", width, c["embedding"]), ("up", width, c["embedding"]),
                                     ("down", c["embedding"], width)):
                writer.add_tensor(p + f"ffn_{name}_exps.weight",
                                  np.stack([matrix(rows, cols) for _ in range(experts)]))
            continue
        if c.get("fused"):  # gate rows, then up rows
            writer.add_tensor(p + "ffn_up.weight", matrix(2 * c["ffn"], c["embedding"]))
        else:
            writer.add_tensor(p + "ffn_gate.weight", matrix(c["ffn"], c["embedding"]))
            writer.add_tensor(p + "ffn_up.weight", matrix(c["ffn"], c["embedding"]))
        writer.add_tensor(p + "ffn_down.weight", matrix(c["embedding"], c["ffn"]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
