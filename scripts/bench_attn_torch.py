#!/usr/bin/env python3
"""bench_attn_torch.py: kiln's flash attention (bench/bench_attn) against
PyTorch's F.scaled_dot_product_attention on its flash backend, bf16, causal,
forward and forward+backward, on the shapes bench_attn knows:
  gpt2   B=8,  H=12, Hkv=12, T=1024, D=64
  llama  B=4,  H=32, Hkv=8,  T=2048, D=128
  char   B=64, H=6,  Hkv=6,  T=256,  D=64
  prefill B=1, H=32, Hkv=8, T=512, D=128
  short128 B=16, H=16, Hkv=16, T=256, D=128
Rounds alternate (kiln, then torch, per round) so both see the same clocks
and heat; each side reports a median per round, the table shows the median
over rounds and the ratio torch_ms / kiln_ms (above 1: kiln is faster).
Backward alone is (fwd+bwd) - fwd on each side.
GQA: torch gets enable_gqa=True where its flash backend takes it; otherwise
K and V are repeated to H heads outside the timed region (said in the table).

Usage: python3 scripts/bench_attn_torch.py --bin build-cuda/bench/bench_attn [--rounds 5] [--out res.json]
"""
import argparse, json, statistics, subprocess, sys

SHAPES = {"gpt2": (8, 12, 12, 1024, 64), "llama": (4, 32, 8, 2048, 128), "char": (64, 6, 6, 256, 64),
          "prefill": (1, 32, 8, 512, 128), "short128": (16, 16, 16, 256, 128)}


def kiln_round(binary, runs):
    out = subprocess.run([binary, str(runs), "all", "bf16"], capture_output=True, text=True, check=True).stdout
    res = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) == 5 and f[0] == "attn":
            res[f[1]] = (float(f[3]), float(f[4]))
    return res


def torch_setup():
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel, SDPBackend
    return torch, F, sdpa_kernel, SDPBackend


def torch_round(runs, reps=4):
    torch, F, sdpa_kernel, SDPBackend = torch_setup()
    res, notes = {}, {}
    for name, (B, H, Hkv, T, D) in SHAPES.items():
        dev = "cuda"
        q = torch.rand(B, H, T, D, device=dev, dtype=torch.bfloat16) * 2 - 1
        k = torch.rand(B, Hkv, T, D, device=dev, dtype=torch.bfloat16) * 2 - 1
        v = torch.rand(B, Hkv, T, D, device=dev, dtype=torch.bfloat16) * 2 - 1
        g = torch.rand(B, H, T, D, device=dev, dtype=torch.bfloat16) * 2 - 1
        kw = {"is_causal": True}
        if Hkv != H:
            try:
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw)
                kw["enable_gqa"] = True
                notes[name] = "enable_gqa"
            except Exception:
                k = k.repeat_interleave(H // Hkv, dim=1).contiguous()
                v = v.repeat_interleave(H // Hkv, dim=1).contiguous()
                notes[name] = "k/v repeated to H heads (untimed)"
        qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))

        def fwd():
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, **kw)

        def fb():
            y = F.scaled_dot_product_attention(qg, kg, vg, **kw)
            y.backward(g)

        out = []
        for fn in (fwd, fb):
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                fn(); fn()
                torch.cuda.synchronize()
                ts = []
                for _ in range(runs):
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    e0.record()
                    for _ in range(reps):
                        fn()
                    e1.record()
                    torch.cuda.synchronize()
                    ts.append(e0.elapsed_time(e1) / reps)
            out.append(statistics.median(ts))
        res[name] = tuple(out)
        del q, k, v, g, qg, kg, vg
        torch.cuda.empty_cache()
    return res, notes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build-cuda/bench/bench_attn")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    kr, tr, notes = {n: [] for n in SHAPES}, {n: [] for n in SHAPES}, {}
    for r in range(a.rounds):
        k = kiln_round(a.bin, a.runs)
        t, notes = torch_round(a.runs)
        for n in SHAPES:
            if n in k: kr[n].append(k[n])
            if n in t: tr[n].append(t[n])
        print(f"round {r}: kiln {k} torch {t}", flush=True)
    rows = []
    print(f"{'shape':6} {'kiln fwd':>9} {'torch fwd':>9} {'ratio':>6} | {'kiln f+b':>9} {'torch f+b':>9} {'ratio':>6} | "
          f"{'kiln bwd':>9} {'torch bwd':>9} {'ratio':>6}")
    for n in SHAPES:
        if not kr[n] or not tr[n]:
            print(f"{n}: missing results"); continue
        kf = statistics.median(x[0] for x in kr[n]); kb = statistics.median(x[1] for x in kr[n])
        tf = statistics.median(x[0] for x in tr[n]); tb = statistics.median(x[1] for x in tr[n])
        row = dict(shape=n, kiln_fwd_ms=kf, torch_fwd_ms=tf, kiln_fb_ms=kb, torch_fb_ms=tb,
                   kiln_bwd_ms=kb - kf, torch_bwd_ms=tb - tf, note=notes.get(n, ""))
        rows.append(row)
        print(f"{n:6} {kf:9.3f} {tf:9.3f} {tf / kf:6.2f} | {kb:9.3f} {tb:9.3f} {tb / kb:6.2f} | "
              f"{kb - kf:9.3f} {tb - tf:9.3f} {(tb - tf) / (kb - kf):6.2f} {notes.get(n, '')}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
