#!/usr/bin/env python3
"""torch_refs.py: PyTorch golden references for kiln's core ops (issue 2).

Builds five small composite computations in PyTorch (float64, fixed seed),
and writes their inputs, outputs and gradients into tests/fixtures/golden_*.bin.
tests/test_torch_golden.c rebuilds the same computations from kiln ops on the
reference and the fast CPU backend and compares. The references use PyTorch's
own modules where they exist (F.cross_entropy, F.conv2d, F.batch_norm,
F.scaled_dot_product_attention, ...), so they are independent of kiln's
decompositions; rope has no torch op and is written out here.

Fixture format "KNFX" (all little endian; read by tests/kn_fixture.h):
    char  magic[4] = "KNFX"
    u32   version  = 1
    u32   n_tensors
    n_tensors times:
        u32   name_len          (1..63), then name_len bytes of name (no NUL)
        u32   dtype             0 = f64, 1 = f32, 2 = i64, 3 = i32
        u32   ndim              0..8 (0 = scalar, one element)
        i64   shape[ndim]
        data  numel * sizeof(dtype) bytes, row-major
The file ends exactly after the last tensor.

Naming convention: "in.X" inputs, "out.X" outputs, "grad.X" gradients of the
case's scalar loss with respect to input X, "hp.X" hyperparameters (0-d).

usage: . scripts/torch_env.sh; python3 tests/torch_refs.py [OUTDIR]   (default tests/fixtures)
"""
import os, struct, sys
import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)
MAGIC, VERSION = b"KNFX", 1
DTYPES = {torch.float64: (0, "d"), torch.float32: (1, "f"), torch.int64: (2, "q"), torch.int32: (3, "i")}


def write_fixture(path, tensors):
    """tensors: list of (name, tensor) in file order."""
    with open(path, "wb") as f:
        f.write(MAGIC + struct.pack("<II", VERSION, len(tensors)))
        for name, t in tensors:
            t = t.detach().contiguous().cpu()
            code, fmt = DTYPES[t.dtype]
            nb = name.encode()
            assert 0 < len(nb) < 64 and t.dim() <= 8
            f.write(struct.pack("<I", len(nb)) + nb)
            f.write(struct.pack("<II", code, t.dim()))
            f.write(struct.pack(f"<{t.dim()}q", *t.shape))
            f.write(struct.pack(f"<{t.numel()}{fmt}", *t.reshape(-1).tolist()))
    print(f"{path}: {len(tensors)} tensors, {os.path.getsize(path)} bytes")


def leaf(*shape, lo=-1.0, hi=1.0):
    return (torch.rand(*shape) * (hi - lo) + lo).requires_grad_(True)


def hp(v):
    return torch.tensor(float(v))


# ---- 1. MLP training step ------------------------------------------------------
# x [8,20] -> linear(20,32) -> gelu (erf) -> linear(32,10) -> cross-entropy vs
# int labels; grads of every parameter; params after one SGD step (lr); and the
# loss of the updated model (checks that the step's graph can be reused).
def case_mlp():
    lr = 0.1
    x = torch.randn(8, 20)
    y = torch.randint(0, 10, (8,))
    w1, b1 = leaf(32, 20, lo=-0.3, hi=0.3), leaf(32, lo=-0.1, hi=0.1)
    w2, b2 = leaf(10, 32, lo=-0.3, hi=0.3), leaf(10, lo=-0.1, hi=0.1)
    params = [("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2)]
    ins = [("in.x", x), ("in.y", y), ("hp.lr", hp(lr))] + [("in." + n, p.detach().clone()) for n, p in params]

    def fwd():
        logits = F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)
        return logits, F.cross_entropy(logits, y)

    logits, loss = fwd()
    opt = torch.optim.SGD([p for _, p in params], lr=lr)
    opt.zero_grad()
    loss.backward()
    outs = [("out.logits", logits), ("out.loss", loss)] + [("grad." + n, p.grad) for n, p in params]
    opt.step()
    with torch.no_grad():
        _, loss2 = fwd()
    outs += [("step." + n, p.detach().clone()) for n, p in params] + [("out.loss_after", loss2)]

    # A short training run from the same initial parameters: 3 steps of SGD
    # with momentum, a new batch each step; the losses and the final params.
    mom = 0.9
    xs, ys = torch.randn(3, 8, 20), torch.randint(0, 10, (3, 8))
    with torch.no_grad():
        for (n, p), (_, v) in zip(params, ins[3:]):
            p.copy_(v)
    opt = torch.optim.SGD([p for _, p in params], lr=lr, momentum=mom)
    losses = []
    for step in range(3):
        opt.zero_grad()
        l = F.cross_entropy(F.linear(F.gelu(F.linear(xs[step], w1, b1)), w2, b2), ys[step])
        l.backward()
        opt.step()
        losses.append(l.detach())
    outs += [("hp.momentum", hp(mom)), ("train.x", xs), ("train.y", ys), ("train.loss", torch.stack(losses))]
    outs += [("train." + n, p) for n, p in params]
    return ins + outs


# ---- 2. conv-net step --------------------------------------------------------------
# x [2,3,12,12] -> conv2d(3,6,k3,s1,p1) -> relu -> max_pool2d(2) ->
# conv2d(6,8,k3,s2,p1,groups=2) -> batch_norm(training, affine) -> silu ->
# adaptive_avg_pool2d(1) -> flatten -> linear(8,5) -> MSE vs target.
def case_conv():
    eps = 1e-5
    x = leaf(2, 3, 12, 12)
    c1w, c1b = leaf(6, 3, 3, 3, lo=-0.4, hi=0.4), leaf(6, lo=-0.1, hi=0.1)
    c2w, c2b = leaf(8, 3, 3, 3, lo=-0.4, hi=0.4), leaf(8, lo=-0.1, hi=0.1)
    bnw, bnb = leaf(8, lo=0.5, hi=1.5), leaf(8, lo=-0.2, hi=0.2)
    lw, lb = leaf(5, 8, lo=-0.5, hi=0.5), leaf(5, lo=-0.1, hi=0.1)
    tgt = torch.randn(2, 5)
    leaves = [("x", x), ("c1w", c1w), ("c1b", c1b), ("c2w", c2w), ("c2b", c2b),
              ("bnw", bnw), ("bnb", bnb), ("lw", lw), ("lb", lb)]
    ins = [("in." + n, t.detach().clone()) for n, t in leaves] + [("in.target", tgt), ("hp.eps", hp(eps))]

    h = F.relu(F.conv2d(x, c1w, c1b, stride=1, padding=1))
    h = F.max_pool2d(h, 2)
    h = F.conv2d(h, c2w, c2b, stride=2, padding=1, groups=2)
    h = F.batch_norm(h, None, None, bnw, bnb, training=True, eps=eps)
    h = F.silu(h)
    h = F.adaptive_avg_pool2d(h, 1).flatten(1)
    out = F.linear(h, lw, lb)
    loss = F.mse_loss(out, tgt)
    loss.backward()
    return ins + [("out.y", out), ("out.loss", loss)] + [("grad." + n, t.grad) for n, t in leaves]


# ---- 3. attention ------------------------------------------------------------------------
# a) q [2,4,7,16], k/v [2,2,7,16] (GQA), causal, default scale; q and k are
#    stored as [B,T,H,D] (the layout a model produces) and transposed to
#    [B,H,T,D]; loss = sum(o * wo) with a random weight wo.
# b) Tq = 3 < Tk = 5 with kiln's bottom-right causal alignment (key j is
#    masked when j > i + Tk - Tq), built as an explicit boolean mask, GQA 4:1,
#    scale 0.3.
# c) the same shapes as b) without a mask.
def case_attn():
    outs = []
    q, k, v = leaf(2, 7, 4, 16), leaf(2, 7, 2, 16), leaf(2, 2, 7, 16)
    wo = torch.randn(2, 4, 7, 16)
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v, is_causal=True, enable_gqa=True)
    (o * wo).sum().backward()
    outs += [("in.a.q_bthd", q.detach().clone()), ("in.a.k_bthd", k.detach().clone()), ("in.a.v", v.detach().clone()),
             ("in.a.wo", wo), ("out.a.o", o), ("grad.a.q_bthd", q.grad), ("grad.a.k_bthd", k.grad), ("grad.a.v", v.grad)]

    Tq, Tk = 3, 5
    allowed = torch.arange(Tk)[None, :] <= torch.arange(Tq)[:, None] + (Tk - Tq)
    for tag, mask in (("b", allowed), ("c", None)):
        q, k, v = leaf(1, 4, Tq, 8), leaf(1, 1, Tk, 8), leaf(1, 1, Tk, 8)
        wo = torch.randn(1, 4, Tq, 8)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3, enable_gqa=True)
        (o * wo).sum().backward()
        outs += [(f"in.{tag}.q", q.detach().clone()), (f"in.{tag}.k", k.detach().clone()), (f"in.{tag}.v", v.detach().clone()),
                 (f"in.{tag}.wo", wo), (f"out.{tag}.o", o),
                 (f"grad.{tag}.q", q.grad), (f"grad.{tag}.k", k.grad), (f"grad.{tag}.v", v.grad)]
    return outs


# ---- 4. norm / softmax / reduction chains --------------------------------------------------
# x [3,5,16]; every term is a scalar; "grad.<term>.<leaf>" is the gradient of
# that one term. Terms:
#   t1 = sum(softmax(layer_norm(x, w, b), -1) * y)
#   t2 = sum(log_softmax(rms_norm(x, wr), dim=1) * z)
#   t3 = sum(logsumexp(permute(x,(2,0,1))[1:13:3], dim=-1))      (permute + stepped slice)
#   t4 = sum(var(x * x[:, 2:3, :].expand(3,5,16), dims (0,2), correction=1))
#   t5 = sum(std(x.transpose(1,2), dim=2, correction=0) * u)      (u [3,16])
#   t6 = sum(norm(x, p=3, dim=-1))
#   t7 = sum(var(x, dim=-1, correction=2, keepdim) * x)           (keepdim broadcast back)
def case_norm():
    eps_ln, eps_rms = 1e-5, 1e-6
    x = leaf(3, 5, 16, lo=-2, hi=2)
    w, b, wr = leaf(16, lo=0.5, hi=1.5), leaf(16, lo=-0.5, hi=0.5), leaf(16, lo=0.5, hi=1.5)
    y, z, u = torch.randn(3, 5, 16), torch.randn(3, 5, 16), torch.randn(3, 16)
    leaves = [("x", x), ("w", w), ("b", b), ("wr", wr)]
    out = [("in." + n, t.detach().clone()) for n, t in leaves]
    out += [("in.y", y), ("in.z", z), ("in.u", u), ("hp.eps_ln", hp(eps_ln)), ("hp.eps_rms", hp(eps_rms))]
    terms = {
        "t1": lambda: (F.layer_norm(x, (16,), w, b, eps_ln).softmax(-1) * y).sum(),
        "t2": lambda: (F.rms_norm(x, (16,), wr, eps_rms).log_softmax(1) * z).sum(),
        "t3": lambda: torch.logsumexp(x.permute(2, 0, 1)[1:13:3], dim=-1).sum(),
        "t4": lambda: torch.var(x * x[:, 2:3, :].expand(3, 5, 16), dim=(0, 2), correction=1).sum(),
        "t5": lambda: (torch.std(x.transpose(1, 2), dim=2, correction=0) * u).sum(),
        "t6": lambda: torch.linalg.vector_norm(x, ord=3, dim=-1).sum(),
        "t7": lambda: (torch.var(x, dim=-1, correction=2, keepdim=True) * x).sum(),
    }
    for name, fn in terms.items():
        val = fn()
        grads = torch.autograd.grad(val, [t for _, t in leaves], allow_unused=True)
        out.append(("out." + name, val))
        for (ln, lt), g in zip(leaves, grads):
            if g is not None:
                out.append((f"grad.{name}.{ln}", g))
    return out


# ---- 5. rope, embedding and index chains ------------------------------------------------------
def rope_ref(x, pos, n_rot, theta, freq_scale, neox):
    # x [..., T, D]; angle(t, i) = pos[t] * freq_scale * theta^(-2i/n_rot)
    i = torch.arange(n_rot // 2, dtype=torch.float64)
    ang = (pos.to(torch.float64)[:, None] * freq_scale) * theta ** (-2 * i / n_rot)[None, :]
    c, s = torch.cos(ang), torch.sin(ang)
    r = x[..., :n_rot]
    if neox:
        a, b = r[..., : n_rot // 2], r[..., n_rot // 2:]
        rot = torch.cat([a * c - b * s, a * s + b * c], dim=-1)
    else:
        p = r.reshape(*r.shape[:-1], n_rot // 2, 2)
        a, b = p[..., 0], p[..., 1]
        rot = torch.stack([a * c - b * s, a * s + b * c], dim=-1).reshape(r.shape)
    return torch.cat([rot, x[..., n_rot:]], dim=-1)


# E [11,16], ids [2,5] -> embedding -> [2,5,16] -> view [2,5,2,8] -> transpose
# [2,2,5,8] (B,H,T,D) -> rope interleaved (n_rot 6 of 8, theta 10000, pos 3..7)
# = r1, rope neox (n_rot 8, theta 500, freq_scale 0.25) of r1 = r2;
# a = index_select(r2, 2, isel [4,0,0,2]) -> [2,2,4,8]
# g = gather(a, 3, gidx [2,2,4,3])
# s = scatter_add(base [2,2,4,8], 3, gidx, g * g)
# loss = sum(s * ws) + sum(r1 * wr)
def case_rope():
    E = leaf(11, 16)
    ids = torch.tensor([[1, 5, 5, 10, 0], [7, 3, 1, 1, 9]])
    pos = torch.arange(3, 8, dtype=torch.int32)
    isel = torch.tensor([4, 0, 0, 2])
    gidx = torch.randint(0, 8, (2, 2, 4, 3))
    base = leaf(2, 2, 4, 8)
    ws, wr = torch.randn(2, 2, 4, 8), torch.randn(2, 2, 5, 8)
    h = F.embedding(ids, E).view(2, 5, 2, 8).transpose(1, 2)
    r1 = rope_ref(h, pos, 6, 10000.0, 1.0, neox=False)
    r2 = rope_ref(r1, pos, 8, 500.0, 0.25, neox=True)
    a = torch.index_select(r2, 2, isel)
    g = torch.gather(a, 3, gidx)
    s = torch.scatter_add(base, 3, gidx, g * g)
    loss = (s * ws).sum() + (r1 * wr).sum()
    loss.backward()
    return [("in.E", E.detach().clone()), ("in.ids", ids), ("in.pos", pos), ("in.isel", isel), ("in.gidx", gidx),
            ("in.base", base.detach().clone()), ("in.ws", ws), ("in.wr", wr),
            ("out.r1", r1), ("out.r2", r2), ("out.g", g), ("out.s", s), ("out.loss", loss),
            ("grad.E", E.grad), ("grad.base", base.grad)]


# ---- 6. more nn ops ------------------------------------------------------------------------
# x [1,4,5,5]; each term is sum(f(...) * r_k) with a fixed random weight r_k, and
# has its own gradients "grad.<term>.<leaf>":
#   t1 conv_transpose2d(x, wt, bt, stride 2, padding 1, output_padding 1, groups 2)
#   t2 gelu_tanh(group_norm(avg_pool2d(t1's output, 3, 2, 1, ceil, no pad count), 3 groups, gw, gb))
#   t3 softplus(max_pool2d(x, 3, stride 1, padding 1, dilation 2, ceil))
#   t4 mish(x) + elu(x, .7) * leaky_relu(x, .1) + hardsigmoid(x) + selu(x) - hardtanh(x, -.5, .8)
#   t5 cumsum(x, 1) * cumprod(x, 3)
#   t6 tanh(conv1d(flatten(pad(pad(x, (1,2,0,0) reflect), (0,0,2,1) replicate), 2), w1d,
#          stride 2, padding 2, dilation 2, groups 2))
#   t7 clamp(masked_fill(tril(where(x > .3, x*x, sin x), 1), x < -1.5, .25), -.7, 1.2)
def case_misc():
    x = leaf(1, 4, 5, 5, lo=-2, hi=2)
    wt, bt = leaf(4, 3, 3, 3, lo=-0.5, hi=0.5), leaf(6, lo=-0.2, hi=0.2)
    gw, gb = leaf(6, lo=0.5, hi=1.5), leaf(6, lo=-0.3, hi=0.3)
    w1d = leaf(6, 2, 3, lo=-0.5, hi=0.5)
    leaves = [("x", x), ("wt", wt), ("bt", bt), ("gw", gw), ("gb", gb), ("w1d", w1d)]
    out = [("in." + n, t.detach().clone()) for n, t in leaves]
    # F.hardsigmoid's backward uses the float constant 1.0f/6 even in float64
    # (gradient off by 3e-8 relative), so its definition relu6(x+3)/6 is spelled out
    hardsigmoid = lambda v: torch.clamp(v + 3, 0, 6) / 6
    ct = lambda: F.conv_transpose2d(x, wt, bt, stride=2, padding=1, output_padding=1, groups=2)
    terms = {
        "t1": ct,
        "t2": lambda: F.gelu(F.group_norm(F.avg_pool2d(ct(), 3, 2, 1, ceil_mode=True, count_include_pad=False), 3, gw, gb, 1e-5),
                             approximate="tanh"),
        "t3": lambda: F.softplus(F.max_pool2d(x, 3, stride=1, padding=1, dilation=2, ceil_mode=True)),
        "t4": lambda: F.mish(x) + F.elu(x, 0.7) * F.leaky_relu(x, 0.1) + hardsigmoid(x) + F.selu(x) - F.hardtanh(x, -0.5, 0.8),
        "t5": lambda: torch.cumsum(x, 1) * torch.cumprod(x, 3),
        "t6": lambda: torch.tanh(F.conv1d(F.pad(F.pad(x, (1, 2, 0, 0), mode="reflect"), (0, 0, 2, 1), mode="replicate").flatten(2),
                                          w1d, None, stride=2, padding=2, dilation=2, groups=2)),
        "t7": lambda: torch.clamp(torch.tril(torch.where(x > 0.3, x * x, torch.sin(x)), 1).masked_fill(x < -1.5, 0.25), -0.7, 1.2),
    }
    for name, fn in terms.items():
        y = fn()
        r = torch.randn(y.shape)
        val = (y * r).sum()
        grads = torch.autograd.grad(val, [t for _, t in leaves], allow_unused=True)
        out += [("in.r" + name, r), ("out." + name, y), ("out.sum" + name, val)]
        for (ln, lt), g in zip(leaves, grads):
            if g is not None:
                out.append((f"grad.{name}.{ln}", g))
    return out


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
    os.makedirs(outdir, exist_ok=True)
    for name, fn in (("mlp", case_mlp), ("conv", case_conv), ("attn", case_attn), ("norm", case_norm), ("rope", case_rope), ("misc", case_misc)):
        torch.manual_seed(1234)
        write_fixture(os.path.join(outdir, f"golden_{name}.bin"), fn())


if __name__ == "__main__":
    main()
