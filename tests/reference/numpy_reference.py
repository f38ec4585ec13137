"""An independent float64 evaluation of the model: the Llama forward pass
written in numpy over the GGUF's tensors as the `gguf` package dequantizes
them. Shares nothing with our engine but the file.

Layout facts it relies on (llama.cpp's converter and GGUF): Qwen2 adds
biases to Q, K and V (`attn_{q,k,v}.bias`); matrices are
stored [out][in]; in `llama` files the Q and K weights were permuted so that
rotary embedding pairs adjacent elements (2i, 2i+1) of each head, while
`qwen2` and `qwen3` files keep Hugging Face's order, which pairs (i, i + d/2);
Qwen3 RMS-norms each head of Q and K before the rotation (`attn_q_norm`,
`attn_k_norm`); Phi-3 files fuse Q, K and V into `attn_qkv` (rows in that
order) and gate and up into `ffn_up` (gate rows first), and pair like Qwen;
the output projection is the token embedding when the file
has no `output.weight`.
"""
import functools

import gguf
import numpy as np

import probe


@functools.lru_cache(maxsize=1)
def model(path=None):
    """(config, float64 tensors) of the GGUF file at `path` (the test model by default)."""
    reader = gguf.GGUFReader(path or probe.MODEL)
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.")}
    arch = meta["general.architecture"]
    tensors = {}
    for t in reader.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64)
        tensors[t.name] = values.reshape(-1, int(t.shape[0])) if len(t.shape) > 1 else values
    config = {
        "layers": meta[f"{arch}.block_count"],
        "heads": meta[f"{arch}.attention.head_count"],
        "kv_heads": meta[f"{arch}.attention.head_count_kv"],
        "eps": meta[f"{arch}.attention.layer_norm_rms_epsilon"],
        "rope_base": meta.get(f"{arch}.rope.freq_base", 10000.0),
        "neox": arch in ("qwen2", "qwen3", "phi3"),
    }
    return config, tensors


def _rms_norm(x, weight, eps):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * weight


def _rope(x, positions, base, neox):
    """x: [tokens, heads, head_dim]; rotates pairs (2i, 2i+1), or (i, i + d/2)
    with neox."""
    head_dim = x.shape[-1]
    theta = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = positions[:, None] * theta[None, :]
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    first, second = ((slice(0, head_dim // 2), slice(head_dim // 2, head_dim)) if neox
                     else (slice(0, head_dim, 2), slice(1, head_dim, 2)))
    a, b = x[..., first], x[..., second]
    out = np.empty_like(x)
    out[..., first] = a * cos - b * sin
    out[..., second] = a * sin + b * cos
    return out


class Session:
    """One sequence evaluated incrementally (a float64 KV cache)."""

    def __init__(self, path=None, mistake=None):
        """mistake: a wrong model, for controls: "no_qkv_bias" leaves out Qwen2's
        biases, "no_qk_norm" Qwen3's Q/K norms, "up_gate_swapped" takes a fused
        ffn_up's halves the wrong way."""
        self.config, self.t = model(path)
        self.mistake = mistake
        self.keys = [None] * self.config["layers"]
        self.values = [None] * self.config["layers"]
        self.length = 0

    def forward(self, ids):
        """Appends `ids`; returns their logits [len(ids), vocab]."""
        c, t = self.config, self.t
        positions = np.arange(self.length, self.length + len(ids), dtype=np.float64)
        h = t["token_embd.weight"][np.asarray(ids)]
        for layer in range(c["layers"]):
            p = f"blk.{layer}."
            x = _rms_norm(h, t[p + "attn_norm.weight"], c["eps"])
            if p + "attn_qkv.weight" in t:
                qkv = x @ t[p + "attn_qkv.weight"].T
                kv_width = (qkv.shape[1] // (c["heads"] + 2 * c["kv_heads"])) * c["kv_heads"]
                q_width = qkv.shape[1] - 2 * kv_width
                q, k, v = np.split(qkv, [q_width, q_width + kv_width], axis=1)
            else:
                q, k, v = (x @ t[p + f"attn_{name}.weight"].T for name in "qkv")
            if p + "attn_q.bias" in t and self.mistake != "no_qkv_bias":
                q, k, v = (y + t[p + f"attn_{name}.bias"] for y, name in zip((q, k, v), "qkv"))
            q = q.reshape(len(ids), c["heads"], -1)
            k = k.reshape(len(ids), c["kv_heads"], -1)
            v = v.reshape(len(ids), c["kv_heads"], -1)
            if p + "attn_q_norm.weight" in t and self.mistake != "no_qk_norm":
                q = _rms_norm(q, t[p + "attn_q_norm.weight"], c["eps"])
                k = _rms_norm(k, t[p + "attn_k_norm.weight"], c["eps"])
            q = _rope(q, positions, c["rope_base"], c["neox"])
            k = _rope(k, positions, c["rope_base"], c["neox"])
            if self.keys[layer] is not None:
                k = np.concatenate([self.keys[layer], k])
                v = np.concatenate([self.values[layer], v])
            self.keys[layer], self.values[layer] = k, v
            group = c["heads"] // c["kv_heads"]
            k_all, v_all = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
            scores = np.einsum("qhd,khd->hqk", q, k_all) / np.sqrt(q.shape[-1])
            visible = np.arange(k_all.shape[0])[None, :] <= positions[:, None]
            scores = np.where(visible[None], scores, -np.inf)
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            scores /= scores.sum(axis=-1, keepdims=True)
            attended = np.einsum("hqk,khd->qhd", scores, v_all).reshape(len(ids), -1)
            h = h + attended @ t[p + "attn_output.weight"].T
            x = _rms_norm(h, t[p + "ffn_norm.weight"], c["eps"])
            if p + "ffn_gate.weight" in t:
                gate, up = x @ t[p + "ffn_gate.weight"].T, x @ t[p + "ffn_up.weight"].T
            else:
                gate, up = np.split(x @ t[p + "ffn_up.weight"].T, 2, axis=1)
                if self.mistake == "up_gate_swapped":
                    gate, up = up, gate
            h = h + (gate / (1.0 + np.exp(-gate)) * up) @ t[p + "ffn_down.weight"].T
        self.length += len(ids)
        out = _rms_norm(h, t["output_norm.weight"], c["eps"])
        return out @ t.get("output.weight", t["token_embd.weight"]).T


def greedy(prompt, tokens, path=None):
    """(continuation, logits [tokens, vocab]): the logits that chose each token."""
    session = Session(path)
    logits = session.forward(prompt)[-1:]
    chosen, all_logits = [], []
    for _ in range(tokens):
        all_logits.append(logits[-1])
        chosen.append(int(np.argmax(logits[-1])))
        logits = session.forward([chosen[-1]])
    return chosen, np.stack(all_logits)
