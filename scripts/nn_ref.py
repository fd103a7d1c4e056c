#!/usr/bin/env python3
"""nn_ref.py: PyTorch references for tests/test_optim.c and tests/test_nn_torch.c.

Writes two fixtures (regenerate with `. scripts/torch_env.sh; python3 scripts/nn_ref.py`):

  tests/fixtures/nn_optim.bin  for each optimizer config: initial params, the
                               gradient fed at each of N steps, params after N
                               steps (torch.optim, foreach=False, float32)
  tests/fixtures/nn_gpt2.bin   a tiny GPT-2 (2 layers, C 32, V 64, T 8) built
                               here with weights generated here: ids, targets,
                               logits, loss, every gradient, the loss at each of
                               10 AdamW steps and the params after them

Format: magic b"KNNN", u32 version 1, u32 record count, then records:
u32 name length, name bytes, u32 ndim, i64 shape[ndim], f32 data (row-major).
Scalars (configs, losses) are 1-d records. The C tests look records up by name.
"""
import math
import struct
import sys

import torch
import torch.nn.functional as F

VERSION = 1


class Writer:
    def __init__(self):
        self.recs = []

    def add(self, name, t):
        t = torch.as_tensor(t).detach().to(torch.float32).contiguous()
        if t.dim() == 0:
            t = t.reshape(1)
        self.recs.append((name, t))

    def save(self, path):
        with open(path, "wb") as f:
            f.write(b"KNNN")
            f.write(struct.pack("<II", VERSION, len(self.recs)))
            for name, t in self.recs:
                nb = name.encode()
                f.write(struct.pack("<I", len(nb)))
                f.write(nb)
                f.write(struct.pack("<I", t.dim()))
                f.write(struct.pack("<%dq" % t.dim(), *t.shape))
                f.write(t.numpy().astype("<f4").tobytes())
        print(f"wrote {path}: {len(self.recs)} records", file=sys.stderr)


# ---- optimizers --------------------------------------------------------------------
# (name, kind id as in kn_optim_kind, constructor, cfg fields for the C side)
# kinds: 0 SGD, 1 Adam, 2 AdamW, 3 RMSprop, 4 Adagrad
OPTIMS = [
    ("sgd", 0, dict(lr=0.1)),
    ("sgd_momentum_wd", 0, dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    ("sgd_nesterov", 0, dict(lr=0.05, momentum=0.8, nesterov=True)),
    ("adam", 1, dict(lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)),
    ("adam_wd", 1, dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)),
    ("adamw", 2, dict(lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)),
    ("rmsprop", 3, dict(lr=0.01, alpha=0.99, eps=1e-8)),
    ("rmsprop_centered_momentum", 3, dict(lr=0.01, alpha=0.9, eps=1e-8, momentum=0.5, centered=True, weight_decay=0.01)),
    ("adagrad", 4, dict(lr=0.1, lr_decay=0.01, weight_decay=0.01, initial_accumulator_value=0.1, eps=1e-10)),
]
CTORS = [torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.RMSprop, torch.optim.Adagrad]
NSTEPS = 8


def optim_fixture(w):
    g = torch.Generator().manual_seed(1234)
    w.add("optim.count", len(OPTIMS))
    w.add("optim.steps", NSTEPS)
    for name, kind, kw in OPTIMS:
        p0 = torch.randn(3, 4, generator=g)
        p1 = torch.randn(5, generator=g)
        grads = [(torch.randn(3, 4, generator=g), torch.randn(5, generator=g)) for _ in range(NSTEPS)]
        params = [p0.clone().requires_grad_(True), p1.clone().requires_grad_(True)]
        opt = CTORS[kind](params, foreach=False, **kw)
        for s in range(NSTEPS):
            params[0].grad = grads[s][0].clone()
            params[1].grad = grads[s][1].clone()
            opt.step()
        # cfg vector: kind lr wd momentum dampening nesterov beta1 beta2 eps alpha centered lr_decay init_acc
        betas = kw.get("betas", (0.9, 0.999))
        cfg = [kind, kw["lr"], kw.get("weight_decay", 0.0), kw.get("momentum", 0.0), kw.get("dampening", 0.0),
               float(kw.get("nesterov", False)), betas[0], betas[1], kw.get("eps", 1e-8), kw.get("alpha", 0.99),
               float(kw.get("centered", False)), kw.get("lr_decay", 0.0), kw.get("initial_accumulator_value", 0.0)]
        pre = f"optim.{name}."
        w.add(pre + "cfg", torch.tensor(cfg, dtype=torch.float64))
        w.add(pre + "p0", p0)
        w.add(pre + "p1", p1)
        w.add(pre + "g0", torch.stack([gg[0] for gg in grads]))
        w.add(pre + "g1", torch.stack([gg[1] for gg in grads]))
        w.add(pre + "out0", params[0])
        w.add(pre + "out1", params[1])


# ---- tiny GPT-2 --------------------------------------------------------------------------
B, T, V, C, L, H = 4, 8, 64, 32, 2, 4


def gpt2_params(g):
    """name -> tensor, in kiln's naming (nn.Linear layout [out, in])."""
    p = {}
    n = lambda *s, std=0.02: torch.randn(*s, generator=g) * std
    p["wte.weight"] = n(V, C)
    p["wpe.weight"] = n(T, C, std=0.01)
    for i in range(L):
        h = f"h.{i}."
        p[h + "ln_1.weight"] = 1 + n(C, std=0.1)
        p[h + "ln_1.bias"] = n(C)
        p[h + "attn.c_attn.weight"] = n(3 * C, C)
        p[h + "attn.c_attn.bias"] = n(3 * C)
        p[h + "attn.c_proj.weight"] = n(C, C, std=0.02 / math.sqrt(2 * L))
        p[h + "attn.c_proj.bias"] = n(C)
        p[h + "ln_2.weight"] = 1 + n(C, std=0.1)
        p[h + "ln_2.bias"] = n(C)
        p[h + "mlp.c_fc.weight"] = n(4 * C, C)
        p[h + "mlp.c_fc.bias"] = n(4 * C)
        p[h + "mlp.c_proj.weight"] = n(C, 4 * C, std=0.02 / math.sqrt(2 * L))
        p[h + "mlp.c_proj.bias"] = n(C)
    p["ln_f.weight"] = 1 + n(C, std=0.1)
    p["ln_f.bias"] = n(C)
    return p


def gpt2_forward(p, ids):
    Bx, Tx = ids.shape
    x = p["wte.weight"][ids] + p["wpe.weight"][:Tx]
    for i in range(L):
        h = f"h.{i}."
        a = F.layer_norm(x, (C,), p[h + "ln_1.weight"], p[h + "ln_1.bias"], 1e-5)
        qkv = F.linear(a, p[h + "attn.c_attn.weight"], p[h + "attn.c_attn.bias"])
        q, k, v = qkv.split(C, dim=2)
        q = q.view(Bx, Tx, H, C // H).transpose(1, 2)
        k = k.view(Bx, Tx, H, C // H).transpose(1, 2)
        v = v.view(Bx, Tx, H, C // H).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(Bx, Tx, C)
        x = x + F.linear(y, p[h + "attn.c_proj.weight"], p[h + "attn.c_proj.bias"])
        m = F.layer_norm(x, (C,), p[h + "ln_2.weight"], p[h + "ln_2.bias"], 1e-5)
        m = F.gelu(F.linear(m, p[h + "mlp.c_fc.weight"], p[h + "mlp.c_fc.bias"]), approximate="tanh")
        x = x + F.linear(m, p[h + "mlp.c_proj.weight"], p[h + "mlp.c_proj.bias"])
    x = F.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"], 1e-5)
    return F.linear(x, p["wte.weight"])


def gpt2_fixture(w):
    g = torch.Generator().manual_seed(4321)
    p = gpt2_params(g)
    ids = torch.randint(0, V, (B, T), generator=g)
    tg = torch.randint(0, V, (B, T), generator=g)
    w.add("gpt2.cfg", torch.tensor([B, T, V, C, L, H], dtype=torch.float64))
    w.add("gpt2.ids", ids)
    w.add("gpt2.targets", tg)
    for k, v in p.items():
        w.add("gpt2.param." + k, v)
    params = {k: v.clone().requires_grad_(True) for k, v in p.items()}
    logits = gpt2_forward(params, ids)
    loss = F.cross_entropy(logits.view(-1, V), tg.view(-1))
    loss.backward()
    w.add("gpt2.logits", logits)
    w.add("gpt2.loss", loss)
    for k, v in params.items():
        w.add("gpt2.grad." + k, v.grad)
    # 10 AdamW steps: decay group (2-d weights) and no-decay group (biases, norms)
    decay = [v for k, v in params.items() if v.dim() >= 2]
    nodecay = [v for k, v in params.items() if v.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    losses = []
    for step in range(10):
        opt.zero_grad()
        l = F.cross_entropy(gpt2_forward(params, ids).view(-1, V), tg.view(-1))
        l.backward()
        losses.append(l.item())
        opt.step()
    w.add("gpt2.losses", torch.tensor(losses, dtype=torch.float64))
    for k, v in params.items():
        w.add("gpt2.after." + k, v)


def main():
    torch.manual_seed(0)
    w = Writer()
    optim_fixture(w)
    w.save("tests/fixtures/nn_optim.bin")
    w = Writer()
    gpt2_fixture(w)
    w.save("tests/fixtures/nn_gpt2.bin")


if __name__ == "__main__":
    main()
