#!/usr/bin/env python3
"""gpt2_ref.py: independent PyTorch references for kiln's GPT-2 and Hugging Face
Llama forward passes (tests/test_llm_formats.c).

The test models are tiny and random; their weights come from a counter-based
generator that tests/test_llm_formats.c implements identically, so the C test
writes the model files (llm.c GPT-2 fp32/bf16, Hugging Face safetensors
f32/f16/bf16) and the fixtures hold only token ids and logits.

Generator: for tensor id `tid` and element i (row-major, in the layout named
below), z = ((tid << 32) + i + 1) * 0x9E3779B97F4A7C15 mod 2^64, then the
splitmix64 finaliser (z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27;
z *= 0x94D049BB133111EB; z ^= z >> 31), k = z >> 56 (0..255).
A weight with scale s (a power of two) is (k - 128) / 128 * s; a gain is
(128 + floor(k / 2)) / 256, in [0.5, 1). Every value has at most 8 significant bits, so it is exact
in bf16 and f16: the same logits are the reference for every file dtype.

Models:
  GPT-2 (llm.c layout, param order of llmc_gpt2.h; tid = 1000 + param index):
    L 2, C 32, NH 4, V 64, Vp 80, maxT 16. LayerNorm eps 1e-5, learned
    positions, fused qkv [3C, C] (+ bias), gelu tanh, MLP 4C, tied output.
  Llama (Hugging Face names; tid 2000 embed, 2001 lm_head, 2002 norm, layer
    l: 2100 + 20 l + j, j = 0 input_layernorm, 1 q, 2 k, 3 v, 4 o,
    5 post_attention_layernorm, 6 gate, 7 up, 8 down):
    L 2, C 32, H 4, Hkv 2, D 8, F 64, V 64, rms eps 1e-5, rope_theta 10000,
    rope_scaling linear factor 2, untied lm_head. HF rotary: rotate halves.
    The same weights with rope_scaling llama3 (factor 8, low/high_freq_factor
    1/4, original_max_position_embeddings 64) and yarn (factor 4, original 64,
    beta_fast/slow defaults): gpt2_hfllama_llama3.ref, gpt2_hfllama_yarn.ref.
    Their inverse frequencies and attention factor come from Hugging Face
    transformers' own rope functions (ROPE_INIT_FUNCTIONS), not from a
    re-derivation, so the C side is checked against the definition.

The forward runs in float64 on the whole sequence (no KV cache); greedy
decoding re-runs the full sequence each step.

Fixture format: the KNLR version 2 format of scripts/llm_ref.py (magic
"KNLR", u32 2, u32 n_cases, u32 n_vocab; per case u32 n_prompt, n_gen, rows;
i32 prompt, i32 greedy, f32 margin, f32 logits[rows][V]).

usage: . scripts/torch_env.sh; python3 scripts/gpt2_ref.py   (writes tests/fixtures/gpt2_*.ref)
needs: torch, numpy, transformers (pip install transformers)
"""
import math, struct, sys
import numpy as np
import torch

torch.set_grad_enabled(False)
M64 = (1 << 64) - 1


def gen_k(tid, n):
    i = np.arange(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = (np.uint64(tid) << np.uint64(32)) + i + np.uint64(1)
        z = z * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(56)).astype(np.float64)


def weight(tid, shape, scale):
    n = int(np.prod(shape))
    return torch.from_numpy((gen_k(tid, n) - 128.0) / 128.0 * scale).reshape(shape)


def gain(tid, shape):
    n = int(np.prod(shape))
    return torch.from_numpy((128.0 + np.floor(gen_k(tid, n) / 2.0)) / 256.0).reshape(shape)


# ---- GPT-2 -----------------------------------------------------------------------------
G = dict(L=2, C=32, NH=4, V=64, Vp=80, T=16)
# (kind, scale) per llm.c parameter, in llm.c order; "g" = gain
GPT2_KINDS = [("w", 0.25), ("w", 0.5), ("g", 0), ("w", 0.125), ("w", 0.25), ("w", 0.125), ("w", 0.25), ("w", 0.125),
              ("g", 0), ("w", 0.125), ("w", 0.25), ("w", 0.125), ("w", 0.125), ("w", 0.125), ("g", 0), ("w", 0.125)]


def gpt2_shapes(g):
    L, C, T, Vp = g["L"], g["C"], g["T"], g["Vp"]
    return [(Vp, C), (T, C), (L, C), (L, C), (L, 3 * C, C), (L, 3 * C), (L, C, C), (L, C), (L, C), (L, C),
            (L, 4 * C, C), (L, 4 * C), (L, C, 4 * C), (L, C), (C,), (C,)]


def gpt2_params(g):
    out = []
    for p, (shape, (kind, s)) in enumerate(zip(gpt2_shapes(g), GPT2_KINDS)):
        out.append(gain(1000 + p, shape) if kind == "g" else weight(1000 + p, shape, s))
    return out


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def causal_attention(q, k, v):
    # q [T, H, D], k, v [T, Hkv, D] (kv heads repeated for grouped-query)
    T, H, D = q.shape
    rep = H // k.shape[1]
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    att = torch.einsum("thd,shd->hts", q, k) / math.sqrt(D)
    att = att + torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    return torch.einsum("hts,shd->thd", torch.softmax(att, dim=-1), v).reshape(T, H * D)


def gpt2_forward(P, g, ids):
    wte, wpe, ln1w, ln1b, qkvw, qkvb, apw, apb, ln2w, ln2b, fcw, fcb, fpw, fpb, lnfw, lnfb = P
    C, NH, V = g["C"], g["NH"], g["V"]
    T = len(ids)
    x = wte[torch.tensor(ids)] + wpe[:T]
    for l in range(g["L"]):
        h = layer_norm(x, ln1w[l], ln1b[l], 1e-5)
        qkv = h @ qkvw[l].T + qkvb[l]
        q, k, v = qkv[:, :C], qkv[:, C:2 * C], qkv[:, 2 * C:]
        a = causal_attention(q.reshape(T, NH, -1), k.reshape(T, NH, -1), v.reshape(T, NH, -1))
        x = x + a @ apw[l].T + apb[l]
        h = layer_norm(x, ln2w[l], ln2b[l], 1e-5)
        x = x + gelu_tanh(h @ fcw[l].T + fcb[l]) @ fpw[l].T + fpb[l]
    return layer_norm(x, lnfw, lnfb, 1e-5) @ wte[:V].T


# ---- Hugging Face Llama -------------------------------------------------------------------
LL = dict(L=2, C=32, H=4, Hkv=2, D=8, F=64, V=64, eps=1e-5, theta=10000.0, factor=2.0)


def llama_params(c):
    C, H, Hkv, D, F, V = c["C"], c["H"], c["Hkv"], c["D"], c["F"], c["V"]
    P = dict(embed=weight(2000, (V, C), 1.0), lm_head=weight(2001, (V, C), 0.25), norm=gain(2002, (C,)), layers=[])
    for l in range(c["L"]):
        b = 2100 + 20 * l
        P["layers"].append(dict(in_ln=gain(b, (C,)), q=weight(b + 1, (H * D, C), 0.25), k=weight(b + 2, (Hkv * D, C), 0.25),
                                v=weight(b + 3, (Hkv * D, C), 0.25), o=weight(b + 4, (C, H * D), 0.25),
                                post_ln=gain(b + 5, (C,)), gate=weight(b + 6, (F, C), 0.25),
                                up=weight(b + 7, (F, C), 0.25), down=weight(b + 8, (C, F), 0.125)))
    return P


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def hf_rope(c, scaling):
    """(inverse frequencies [D/2] float64, attention factor) from transformers."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    cfg = LlamaConfig(hidden_size=c["C"], num_attention_heads=c["H"], num_key_value_heads=c["Hkv"],
                      rope_theta=c["theta"], max_position_embeddings=1024, rope_scaling=scaling)
    inv, af = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](cfg, "cpu")
    return inv.to(torch.float64), float(af)


def llama_forward(P, c, ids):
    T, H, Hkv, D = len(ids), c["H"], c["Hkv"], c["D"]
    if "inv" in c:                                                   # llama3 / yarn (hf_rope)
        inv, af = c["inv"], c["af"]
        t = torch.arange(T, dtype=torch.float64)
    else:
        inv, af = 1.0 / (c["theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D)), 1.0
        t = torch.arange(T, dtype=torch.float64) / c["factor"]      # linear rope scaling
    fr = torch.outer(t, inv)
    emb = torch.cat([fr, fr], dim=-1)
    cos, sin = emb.cos()[:, None, :] * af, emb.sin()[:, None, :] * af   # HF scales cos/sin by af

    def rms(x, w):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + c["eps"]) * w

    x = P["embed"][torch.tensor(ids)]
    for Lw in P["layers"]:
        h = rms(x, Lw["in_ln"])
        q = (h @ Lw["q"].T).reshape(T, H, D)
        k = (h @ Lw["k"].T).reshape(T, Hkv, D)
        v = (h @ Lw["v"].T).reshape(T, Hkv, D)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        x = x + causal_attention(q, k, v) @ Lw["o"].T
        h = rms(x, Lw["post_ln"])
        x = x + (torch.nn.functional.silu(h @ Lw["gate"].T) * (h @ Lw["up"].T)) @ Lw["down"].T
    return rms(x, P["norm"]) @ P["lm_head"].T


def write_ref(path, fwd, V, prompts, n_gen):
    with open(path, "wb") as f:
        f.write(b"KNLR" + struct.pack("<III", 2, len(prompts), V))
        for p in prompts:
            logits = fwd(p)
            ids, gen, margin = list(p), [], []
            for _ in range(n_gen):
                last = fwd(ids)[-1]
                top = torch.topk(last, 2).values
                nxt = int(torch.argmax(last))
                gen.append(nxt); margin.append(float(top[0] - top[1])); ids.append(nxt)
            f.write(struct.pack("<III", len(p), n_gen, len(p)))
            f.write(struct.pack(f"<{len(p)}i", *p))
            f.write(struct.pack(f"<{n_gen}i", *gen))
            f.write(struct.pack(f"<{n_gen}f", *margin))
            f.write(logits.to(torch.float32).numpy().astype("<f4").tobytes())
            print(path, "prompt", p, "greedy", gen, "min margin %.4f" % min(margin), file=sys.stderr)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures"
    P = gpt2_params(G)
    write_ref(f"{out}/gpt2_tiny.ref", lambda ids: gpt2_forward(P, G, ids), G["V"],
              [[3, 17, 42, 5, 60, 1, 9], [10, 20, 30]], 8)
    Q = llama_params(LL)
    write_ref(f"{out}/gpt2_hfllama.ref", lambda ids: llama_forward(Q, LL, ids), LL["V"],
              [[1, 7, 33, 12, 50, 2, 63, 8, 19], [4, 5, 6, 7]], 10)
    for name, scaling in [("llama3", dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                          original_max_position_embeddings=64)),
                          ("yarn", dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=64))]:
        c = dict(LL)
        c["inv"], c["af"] = hf_rope(c, scaling)
        print(name, "inv_freq", c["inv"].tolist(), "attention factor", c["af"], file=sys.stderr)
        write_ref(f"{out}/gpt2_hfllama_{name}.ref", lambda ids, c=c: llama_forward(Q, c, ids), LL["V"],
                  [[1, 7, 33, 12, 50, 2, 63, 8, 19, 40, 41, 3, 22, 61, 17, 9, 30], [4, 5, 6, 7]], 12)


if __name__ == "__main__":
    main()
