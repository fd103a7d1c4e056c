#!/usr/bin/env python3
"""bench_gpu.py: issue 12's GPU benchmarks in one run, kiln beside PyTorch at
its best, one table with ratios at the end (docs/PERF.md records it).

    python3 scripts/bench_gpu.py --kiln build-cuda/kiln --data input.txt [--model DIR]
                                 [--quant FILE.gguf] [--rounds 3] [--only train,char,decode]

Rows (each pair measured in the same process run, on the same GPU, kiln and
the peer alternating):
  train   GPT-2 124M, T=1024, B=8 (train16: B=16), vocabulary 50257: `kiln train gpt2
          --precision bf16` vs PyTorch bf16 autocast + torch.compile + fused
          AdamW (scripts/bench_train_gpu_torch.py, random tokens)
  char    the char GPT shape (6 x 384, 6 heads, T=256, B=64, vocabulary 65)
  decode  SmolLM2-135M bf16 (--model: a directory or file; default: random
          weights written by scripts/make_random_smollm2.py): a 512-token
          prompt (pp512) and tg128 after it, vs PyTorch with a static cache,
          torch.compile for the prompt and torch.compile(mode="reduce-overhead")
          for the steps (scripts/bench_decode_torch.py); with --quant also
          kiln on that quantized file with --gpu-dtype file
  decode8b the same on a Llama-3-8B-shaped model (random bf16 weights, 16 GB,
          written by the peer's script for both; not in the default set)
Both sides train without gradient clipping (kiln --clip 0; the peer does not
clip). Ratios are kiln / PyTorch (higher is better for kiln).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd):
    p = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    sys.stdout.write(p.stdout)
    sys.stdout.flush()
    if p.returncode:
        sys.stdout.write(p.stderr[-2000:])
    return p.stdout


def train_row(a, name, gpt, kiln_args):
    v, t, c, n_layers, h, b = gpt.split(",")
    kcmd = (f"KN_BACKEND=cuda {a.kiln} train gpt2 --data {a.data} --layers {n_layers} --dim {c} --heads {h} "
            f"--ctx {t} --batch {b} --steps 14 --eval-every 0 --eval-batches 1 --sample-len 0 --warmup 2 "
            f"--clip 0 --precision bf16 {kiln_args}")
    if name == "char":   # the char model: vocabulary from the text's characters
        kcmd = kcmd.replace(" train gpt2 ", " train char ")
    else:                # all 50257 ids, as the peer (kiln's default keeps the ids the text has)
        kcmd += " --full-vocab 1"
    out = run(f"python3 {HERE}/bench_train_gpu_torch.py --gpt {gpt} --steps 15 --warmup 5 --modes bf16-compiled "
              f"--rounds {a.rounds} --kiln '{kcmd}'")
    torch_r = [float(m) for m in re.findall(r"^torch bf16-compiled (\S+) tok/s", out, re.M)]
    kiln_r = [float(m) for m in re.findall(r"^kiln: .*?(\d+) tok/s", out, re.M)]
    return torch_r, kiln_r


def decode_rows(a, shape="smollm2-135m"):
    """(name, torch rounds, kiln rounds) for pp512 and tg128 of each kiln command"""
    model, save = a.model, ""
    if shape != "smollm2-135m":       # the peer writes its own random weights for kiln to load
        model = f"/tmp/kn_{shape}_random"
        save = f"--save {model}"
    elif not model:
        model = "/tmp/kn_smollm2_random"
        run(f"python3 {HERE}/make_random_smollm2.py {model} > /dev/null")
    cmds = [f"{a.kiln} bench -m {model} --backend cuda --gpu-dtype bf16 --bench-prompt 512 -n 128 -r 3"]
    if a.quant and shape == "smollm2-135m":
        cmds.append(f"{a.kiln} bench -m {a.quant} --backend cuda --gpu-dtype file --bench-prompt 512 -n 128 -r 3")
    kargs = " ".join(f"--kiln '{c}'" for c in cmds)
    out = run(f"python3 {HERE}/bench_decode_torch.py --shape {shape} {save} --prompt 512 --gen 128 "
              f"--rounds {a.rounds + 2} {kargs}")
    rows = []
    for test in ("pp512", "tg128"):
        torch_r = [float(m) for m in re.findall(r"^torch-compiled %s: (\S+) tok/s" % test, out, re.M)]
        for j, c in enumerate(cmds):
            kr = [float(m) for m in re.findall(r"^kiln\[%d\] %s: (\S+) tok/s" % (j, test), out, re.M)]
            what = "bf16" if j == 0 else os.path.basename(a.quant)
            rows.append((f"{what} {test}", torch_r, kr))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default="build-cuda/kiln")
    ap.add_argument("--data", required=True, help="training text (tinyshakespeare input.txt)")
    ap.add_argument("--model", default="", help="SmolLM2-135M directory or file for decode (default: random weights)")
    ap.add_argument("--quant", default="", help="a quantized GGUF also decoded with --gpu-dtype file")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default="train,char,decode")
    a = ap.parse_args()
    want = set(a.only.split(","))
    rows = []
    if "train" in want:
        rows.append(("GPT-2 124M train, B=8 T=1024 (tok/s)",) + train_row(a, "train", "50257,1024,768,12,12,8", ""))
    if "train16" in want:
        rows.append(("GPT-2 124M train, B=16 T=1024 (tok/s)",) + train_row(a, "train", "50257,1024,768,12,12,16", ""))
    if "char" in want:
        rows.append(("char GPT 6x384 train, B=64 T=256 (tok/s)",) + train_row(a, "char", "65,256,384,6,6,64", ""))
    if "decode" in want:
        rows += [(f"SmolLM2-135M {n} (tok/s)", t, k) for n, t, k in decode_rows(a)]
    if "decode8b" in want:
        rows += [(f"Llama-3-8B-shaped {n} (tok/s)", t, k) for n, t, k in decode_rows(a, "llama3-8b")]
    print("\n| work | kiln (median) | PyTorch compiled (median) | kiln / PyTorch |")
    print("|---|---|---|---|")
    for name, t, k in rows:
        tm = statistics.median(t) if t else float("nan")
        km = statistics.median(k) if k else float("nan")
        print(f"| {name} | {km:,.0f} | {tm:,.0f} | {km / tm:.2f} |")


if __name__ == "__main__":
    main()
