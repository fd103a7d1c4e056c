#!/usr/bin/env python3
"""amp_gpt2_ref.py: PyTorch bf16-autocast reference for a GPT-2 training run
(tests/test_precision.c, gpt2_bf16_tracks_torch_autocast; issue 12: "from the
same initial weights and batches, the first 20 GPT-2 steps' loss matches
PyTorch with bf16 autocast within bf16 tolerance").

Writes tests/fixtures/amp_gpt2.bin (regenerate with
`. scripts/torch_env.sh; python3 scripts/amp_gpt2_ref.py`): a small GPT-2
(scripts/bench_train_torch.py's model: LayerNorm, fused qkv, causal SDPA,
gelu-tanh MLP, learned positions, tied head), its initial weights under
kiln's module names (kiln_nn.h kn_gpt2_new), STEPS batches of token ids, and
the losses of STEPS AdamW steps (torch.optim.AdamW, one parameter group)
trained once in float32 and once under torch.autocast("cpu", bfloat16) from
the same weights on the same batches. Master weights, gradients and optimizer
state stay f32 in both, as in kiln's policy.

Rounding points differ a little from kiln's policy (autocast adds a Linear's
bias and applies gelu on the bf16 matmul output; kiln adds the bias and
applies the activation in f32 after casting the product back), so the test
asks kiln's bf16 run to stay within bf16 tolerance of this one, and its f32
run to match the f32 losses closely.

Format "KNFX" v1 (tests/kn_fixture.h), as scripts/amp_ref.py writes it.
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from amp_ref import save  # noqa: E402  (the KNFX writer)
from bench_train_torch import GPT  # noqa: E402  (the model of the training benchmarks)

STEPS, LR, WD = 20, 3e-3, 0.1
V, T, C, L, H, B = 64, 16, 32, 2, 2, 4


def kiln_names(model):
    """torch name -> kiln name (kn_gpt2_new): the block's layers sit under attn. / mlp."""
    ren = {"c_attn": "attn.c_attn", "c_proj": "attn.c_proj", "c_fc": "mlp.c_fc", "mlp_proj": "mlp.c_proj"}
    out = []
    for name, p in model.named_parameters():
        parts = name.split(".")
        if parts[0] == "h" and parts[2] in ren:
            parts[2] = ren[parts[2]]
        out.append((".".join(parts), p))
    return out


def run(model0, batches, bf16):
    model = GPT(V, T, C, L, H)
    model.load_state_dict(model0.state_dict())
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD, foreach=False)
    losses = []
    for ids in batches:
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(ids[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, V), ids[:, 1:].reshape(-1))
        loss.backward()
        assert all(p.grad.dtype == torch.float32 for p in model.parameters())
        opt.step()
        losses.append(loss.item())
    return torch.tensor(losses, dtype=torch.float32)


def main():
    torch.manual_seed(0)
    model0 = GPT(V, T, C, L, H)
    with torch.no_grad():       # GPT-2's init scale, so 20 steps move the loss visibly
        for name, p in model0.named_parameters():
            if p.dim() == 2:
                p.normal_(0, 0.02)
            elif name.endswith("bias"):
                p.normal_(0, 0.02)   # nonzero biases: their placement (bf16 or f32) is exercised
    # T + 1 tokens a row (inputs and next-token targets), a repeating pattern
    # plus noise so the loss falls
    base = torch.arange(T + 1) % 7
    batches = [((base + torch.randint(0, 3, (B, T + 1)) * 7) % V).long() for s in range(STEPS)]
    lf, lb = run(model0, batches, False), run(model0, batches, True)
    print("f32 ", " ".join("%.4f" % v for v in lf[::4]))
    print("bf16", " ".join("%.4f" % v for v in lb[::4]))
    print("max |bf16 - f32| %.3e" % (lb - lf).abs().max().item())
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/amp_gpt2.bin"
    recs = [("w." + n, p.detach().clone()) for n, p in kiln_names(model0)]
    recs += [("in.ids", torch.stack(batches)), ("loss.f32", lf), ("loss.bf16", lb),
             ("cfg", torch.tensor([V, T, C, L, H, B, LR, WD], dtype=torch.float32))]
    save(out, recs)


if __name__ == "__main__":
    main()
