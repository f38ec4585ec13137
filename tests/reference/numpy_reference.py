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

Gemma 2 and 3 (Hugging Face's modeling code): embeddings times
sqrt(hidden size); GELU (tanh form) on the gate; each sublayer's output
RMS-normed again (`post_attention_norm`, `post_ffw_norm`; the converter stored
every norm weight as 1 + w) before the residual add; sliding-window layers,
where a query at position p sees keys at positions > p - window (Gemma 2:
the even layers; Gemma 3: all but every sixth), which in Gemma 3 rotate with
base 10,000 and no scaling; Gemma 2 soft-caps attention scores and final
logits as cap * tanh(x / cap); Gemma 3 RMS-norms Q and K heads like Qwen3.

Mixtures of experts (Hugging Face's Qwen3MoeSparseMoeBlock and
OlmoeSparseMoeBlock): the softmax of the router's logits (`ffn_gate_inp`),
the top `expert_used_count` experts, their probabilities renormalised to sum
to 1 for Qwen3-MoE (norm_topk_prob) and not for OLMoE, each expert a SwiGLU
over `ffn_{gate,up,down}_exps[e]`; OLMoE RMS-norms Q and K over their whole
width before splitting heads.
"""
import functools

import gguf
import numpy as np

import gguf_files
import probe


@functools.lru_cache(maxsize=1)
def model(path=None):
    """(config, float64 tensors) of the GGUF file at `path` (the test model by default)."""
    reader = gguf_files.read(path or probe.MODEL)
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
        "neox": arch in ("qwen2", "qwen3", "phi3", "gemma2", "gemma3", "qwen3moe", "olmoe"),
        "gemma": arch.startswith("gemma"),
        "rope_scale": (meta.get(f"{arch}.rope.scaling.factor", 1.0)
                       if meta.get(f"{arch}.rope.scaling.type") == "linear" else 1.0),
        "attn_softcap": meta.get(f"{arch}.attn_logit_softcapping", 50.0 if arch == "gemma2" else 0),
        "final_softcap": meta.get(f"{arch}.final_logit_softcapping",
                                  30.0 if arch == "gemma2" else 0),
        "window": meta.get(f"{arch}.attention.sliding_window", 0),
        "experts_used": meta.get(f"{arch}.expert_used_count", 0),
        "normalize_experts": arch == "qwen3moe",
    }
    embedding = meta[f"{arch}.embedding_length"]
    layers = config["layers"]
    if arch == "gemma2":
        config["sliding"] = [i % 2 == 0 for i in range(layers)]
        config["sliding_rope"] = (config["rope_base"], config["rope_scale"])
    elif arch == "gemma3":
        config["sliding"] = [(i + 1) % 6 != 0 for i in range(layers)]
        config["sliding_rope"] = (10000.0, 1.0)
    else:
        config["sliding"] = [False] * layers
    config["embedding_scale"] = np.sqrt(embedding) if config["gemma"] else 1.0
    return config, tensors


def _rms_norm(x, weight, eps):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * weight


def _softcap(x, cap):
    return cap * np.tanh(x / cap) if cap else x


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def _rope(x, positions, base, neox, scale=1.0):
    """x: [tokens, heads, head_dim]; rotates pairs (2i, 2i+1), or (i, i + d/2)
    with neox; positions divided by `scale` (linear scaling)."""
    head_dim = x.shape[-1]
    theta = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim) / scale
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
        ffn_up's halves the wrong way, "no_window" lets sliding layers see
        every key, "one_rope" rotates sliding layers like global ones,
        "no_expert_norm" does not renormalise the chosen experts' weights."""
        self.config, self.t = model(path)
        self.mistake = mistake
        self.keys = [None] * self.config["layers"]
        self.values = [None] * self.config["layers"]
        self.length = 0
        # Per position, the smallest gap over the layers between the router
        # logits of the last expert chosen and the first one left out (MoE
        # files): where it is tiny, any rounding may swap the two experts.
        self.router_margins = []

    def forward(self, ids):
        """Appends `ids`; returns their logits [len(ids), vocab]."""
        c, t = self.config, self.t
        positions = np.arange(self.length, self.length + len(ids), dtype=np.float64)
        self._step_margins = np.full(len(ids), np.inf)
        h = t["token_embd.weight"][np.asarray(ids)] * c["embedding_scale"]
        for layer in range(c["layers"]):
            p = f"blk.{layer}."
            sliding = c["sliding"][layer]
            base, scale = (c["sliding_rope"] if sliding and self.mistake != "one_rope"
                           else (c["rope_base"], c["rope_scale"]))
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
            whole_norm = (p + "attn_q_norm.weight" in t
                          and t[p + "attn_q_norm.weight"].shape[-1] == q.shape[-1])
            if whole_norm and self.mistake != "no_qk_norm":  # OLMoE
                q = _rms_norm(q, t[p + "attn_q_norm.weight"], c["eps"])
                k = _rms_norm(k, t[p + "attn_k_norm.weight"], c["eps"])
            q = q.reshape(len(ids), c["heads"], -1)
            k = k.reshape(len(ids), c["kv_heads"], -1)
            v = v.reshape(len(ids), c["kv_heads"], -1)
            if (p + "attn_q_norm.weight" in t and not whole_norm
                    and self.mistake != "no_qk_norm"):
                q = _rms_norm(q, t[p + "attn_q_norm.weight"], c["eps"])
                k = _rms_norm(k, t[p + "attn_k_norm.weight"], c["eps"])
            q = _rope(q, positions, base, c["neox"], scale)
            k = _rope(k, positions, base, c["neox"], scale)
            if self.keys[layer] is not None:
                k = np.concatenate([self.keys[layer], k])
                v = np.concatenate([self.values[layer], v])
            self.keys[layer], self.values[layer] = k, v
            group = c["heads"] // c["kv_heads"]
            k_all, v_all = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
            scores = np.einsum("qhd,khd->hqk", q, k_all) / np.sqrt(q.shape[-1])
            scores = _softcap(scores, c["attn_softcap"])
            key_positions = np.arange(k_all.shape[0])[None, :]
            visible = key_positions <= positions[:, None]
            if sliding and self.mistake != "no_window":
                visible &= key_positions > positions[:, None] - c["window"]
            scores = np.where(visible[None], scores, -np.inf)
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            scores /= scores.sum(axis=-1, keepdims=True)
            attended = np.einsum("hqk,khd->qhd", scores, v_all).reshape(len(ids), -1)
            attended = attended @ t[p + "attn_output.weight"].T
            if p + "post_attention_norm.weight" in t:
                attended = _rms_norm(attended, t[p + "post_attention_norm.weight"], c["eps"])
            h = h + attended
            x = _rms_norm(h, t[p + "ffn_norm.weight"], c["eps"])
            if p + "ffn_gate_inp.weight" in t:
                h = h + self._experts(p, x)
                continue
            if p + "ffn_gate.weight" in t:
                gate, up = x @ t[p + "ffn_gate.weight"].T, x @ t[p + "ffn_up.weight"].T
            else:
                gate, up = np.split(x @ t[p + "ffn_up.weight"].T, 2, axis=1)
                if self.mistake == "up_gate_swapped":
                    gate, up = up, gate
            activated = _gelu_tanh(gate) if c["gemma"] else gate / (1.0 + np.exp(-gate))
            ffn = (activated * up) @ t[p + "ffn_down.weight"].T
            if p + "post_ffw_norm.weight" in t:
                ffn = _rms_norm(ffn, t[p + "post_ffw_norm.weight"], c["eps"])
            h = h + ffn
        self.length += len(ids)
        self.router_margins.extend(self._step_margins)
        out = _rms_norm(h, t["output_norm.weight"], c["eps"])
        return _softcap(out @ t.get("output.weight", t["token_embd.weight"]).T, c["final_softcap"])


    def _experts(self, p, x):
        c, t = self.config, self.t
        experts = t[p + "ffn_gate_inp.weight"].shape[0]
        gate_w, up_w, down_w = (t[p + f"ffn_{name}_exps.weight"].reshape(experts, -1, t[
            p + f"ffn_{name}_exps.weight"].shape[-1]) for name in ("gate", "up", "down"))
        logits = x @ t[p + "ffn_gate_inp.weight"].T
        ordered = -np.sort(-logits, axis=-1)
        margins = ordered[:, c["experts_used"] - 1] - ordered[:, c["experts_used"]]
        self._step_margins = np.minimum(self._step_margins, margins)
        probabilities = np.exp(logits - logits.max(axis=-1, keepdims=True))
        probabilities /= probabilities.sum(axis=-1, keepdims=True)
        out = np.zeros_like(x)
        for row in range(x.shape[0]):
            chosen = np.argsort(-probabilities[row], kind="stable")[:c["experts_used"]]
            weights = probabilities[row][chosen]
            if c["normalize_experts"] and self.mistake != "no_expert_norm":
                weights = weights / weights.sum()
            for e, weight in zip(chosen, weights):
                gate, up = x[row] @ gate_w[e].T, x[row] @ up_w[e].T
                out[row] += weight * ((gate / (1.0 + np.exp(-gate)) * up) @ down_w[e].T)
        return out


def greedy(prompt, tokens, path=None, session=None):
    """(continuation, logits [tokens, vocab]): the logits that chose each token."""
    session = session or Session(path)
    logits = session.forward(prompt)[-1:]
    chosen, all_logits = [], []
    for _ in range(tokens):
        all_logits.append(logits[-1])
        chosen.append(int(np.argmax(logits[-1])))
        logits = session.forward([chosen[-1]])
    return chosen, np.stack(all_logits)
