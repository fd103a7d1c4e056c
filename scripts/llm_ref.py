#!/usr/bin/env python3
"""llm_ref.py: an independent PyTorch reference for kiln's Llama forward pass.

Reads a GGUF (llama architecture) with the `gguf` package, dequantizes every
weight to float64, runs the transformer in PyTorch (float64) and writes, for
each prompt (token ids), the logits of every position and the greedy
continuation, to a small fixture file that tests/test_llm.c compares against.
The same for llama2.c checkpoints (fp32, legacy header), read with numpy.

Fixture format (little endian): magic "KNLR", u32 version 2, u32 n_cases,
u32 n_vocab; per case: u32 n_prompt, u32 n_gen, u32 n_logit_rows, i32
prompt[n_prompt], i32 greedy[n_gen], f32 margin[n_gen] (top-1 minus top-2
logit at each greedy step: small margins are near ties that rounding may
flip), f32 logits[n_logit_rows][n_vocab] (the last n_logit_rows positions of
the prompt).

usage: . scripts/torch_env.sh; python3 scripts/llm_ref.py gguf MODEL OUT "ids;ids;..." N_GEN ROWS
       python3 scripts/llm_ref.py l2c  MODEL OUT "ids;..."  N_GEN ROWS
"""
import struct, sys
import numpy as np
import torch

torch.set_grad_enabled(False)


def rope_interleaved(x, pos, n_rot, theta, freq_scale):
    # x [T, H, D]; rotates pairs (x[2i], x[2i+1]) of the first n_rot dims
    T, H, D = x.shape
    i = torch.arange(0, n_rot, 2, dtype=torch.float64)
    inv = theta ** (-i / n_rot)
    ang = (pos.to(torch.float64)[:, None] * freq_scale) * inv[None, :]          # [T, n_rot/2]
    c, s = torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]
    xr = x[..., :n_rot].reshape(T, H, n_rot // 2, 2)
    a, b = xr[..., 0], xr[..., 1]
    out = torch.stack([a * c - b * s, a * s + b * c], dim=-1).reshape(T, H, n_rot)
    return torch.cat([out, x[..., n_rot:]], dim=-1)


class Llama:
    def __init__(self, W, cfg):
        self.W, self.c = W, cfg

    def forward(self, ids):
        c, W = self.c, self.W
        T = len(ids)
        x = W["tok"][torch.tensor(ids)]
        pos = torch.arange(T)
        H, Hkv, D = c["heads"], c["kv_heads"], c["dim"] // c["heads"]

        def rms(v, w):
            return v / torch.sqrt((v * v).mean(-1, keepdim=True) + c["eps"]) * w

        mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
        for L in W["layers"]:
            h = rms(x, L["attn_norm"])
            q = (h @ L["wq"].T).reshape(T, H, D)
            k = (h @ L["wk"].T).reshape(T, Hkv, D)
            v = (h @ L["wv"].T).reshape(T, Hkv, D)
            q = rope_interleaved(q, pos, c["n_rot"], c["theta"], c["freq_scale"])
            k = rope_interleaved(k, pos, c["n_rot"], c["theta"], c["freq_scale"])
            rep = H // Hkv
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
            att = torch.einsum("thd,shd->hts", q, k) / D ** 0.5 + mask
            att = torch.softmax(att, dim=-1)
            o = torch.einsum("hts,shd->thd", att, v).reshape(T, H * D)
            x = x + o @ L["wo"].T
            h = rms(x, L["ffn_norm"])
            x = x + (torch.nn.functional.silu(h @ L["w1"].T) * (h @ L["w3"].T)) @ L["w2"].T
        return rms(x, W["out_norm"]) @ W["out"].T          # [T, V]


def load_gguf(path):
    import gguf
    r = gguf.GGUFReader(path)

    def val(key, default=None):
        f = r.fields.get(key)
        if f is None:
            return default
        return f.parts[f.data[0]].tolist()[0] if len(f.data) == 1 else default

    t = {}
    for ten in r.tensors:
        a = gguf.quants.dequantize(ten.data, ten.tensor_type)
        t[ten.name] = torch.from_numpy(np.array(a, dtype=np.float64)).reshape([int(n) for n in reversed(ten.shape.tolist())])
    dim = val("llama.embedding_length")
    cfg = dict(dim=dim, heads=val("llama.attention.head_count"), kv_heads=val("llama.attention.head_count_kv"),
               eps=val("llama.attention.layer_norm_rms_epsilon", 1e-5), theta=val("llama.rope.freq_base", 10000.0),
               freq_scale=1.0)
    cfg["n_rot"] = val("llama.rope.dimension_count", dim // cfg["heads"])
    n = val("llama.block_count")
    W = dict(tok=t["token_embd.weight"], out_norm=t["output_norm.weight"],
             out=t.get("output.weight", t["token_embd.weight"]), layers=[])
    for l in range(n):
        g = lambda k: t[f"blk.{l}.{k}.weight"]
        W["layers"].append(dict(attn_norm=g("attn_norm"), wq=g("attn_q"), wk=g("attn_k"), wv=g("attn_v"),
                                wo=g("attn_output"), ffn_norm=g("ffn_norm"), w1=g("ffn_gate"), w2=g("ffn_down"),
                                w3=g("ffn_up")))
    return Llama(W, cfg)


def load_l2c(path):
    raw = open(path, "rb").read()
    dim, hid, nl, nh, nkv, V, seq = struct.unpack("<7i", raw[:28])
    shared = V > 0
    V = abs(V)
    f = np.frombuffer(raw[28:], dtype=np.float32).astype(np.float64)
    o = 0
    hs = dim // nh
    kv = nkv * hs

    def take(*shape):
        nonlocal o
        n = int(np.prod(shape))
        a = torch.from_numpy(f[o:o + n].copy()).reshape(shape)
        o += n
        return a
    tok = take(V, dim); ra = take(nl, dim); wq = take(nl, dim, dim); wk = take(nl, kv, dim); wv = take(nl, kv, dim)
    wo = take(nl, dim, dim); rf = take(nl, dim); w1 = take(nl, hid, dim); w2 = take(nl, dim, hid); w3 = take(nl, hid, dim)
    rfin = take(dim)
    o += seq * hs // 2 * 2
    out = tok if shared else take(V, dim)
    W = dict(tok=tok, out_norm=rfin, out=out, layers=[dict(attn_norm=ra[l], wq=wq[l], wk=wk[l], wv=wv[l], wo=wo[l],
             ffn_norm=rf[l], w1=w1[l], w2=w2[l], w3=w3[l]) for l in range(nl)])
    return Llama(W, dict(dim=dim, heads=nh, kv_heads=nkv, eps=1e-5, theta=10000.0, freq_scale=1.0, n_rot=hs))


def main():
    kind, model, out, cases, n_gen, rows = sys.argv[1:7]
    n_gen, rows = int(n_gen), int(rows)
    m = load_gguf(model) if kind == "gguf" else load_l2c(model)
    prompts = [[int(t) for t in c.split()] for c in cases.split(";")]
    V = m.W["out"].shape[0]
    with open(out, "wb") as f:
        f.write(b"KNLR" + struct.pack("<III", 2, len(prompts), V))
        for p in prompts:
            logits = m.forward(p)
            ids = list(p)
            gen, margin = [], []
            for _ in range(n_gen):
                last = m.forward(ids)[-1]
                top = torch.topk(last, 2).values
                nxt = int(torch.argmax(last))
                gen.append(nxt)
                margin.append(float(top[0] - top[1]))
                ids.append(nxt)
            r = min(rows, len(p))
            f.write(struct.pack("<III", len(p), n_gen, r))
            f.write(struct.pack(f"<{len(p)}i", *p))
            f.write(struct.pack(f"<{n_gen}i", *gen))
            f.write(struct.pack(f"<{n_gen}f", *margin))
            f.write(logits[-r:].to(torch.float32).numpy().astype("<f4").tobytes())
            print("prompt", p[:8], "... greedy", gen, "min margin %.3f" % min(margin or [0]), file=sys.stderr)


if __name__ == "__main__":
    main()
