"""bench_decode_torch.py: the GPU decode peer at its best, for `kiln bench`.

PyTorch decode of a Llama-shaped model (SmolLM2-135M's shapes, random bf16
weights: values do not change the speed) with a static KV cache and
torch.compile(mode="reduce-overhead") (CUDA graphs), greedy, one token a
step. Prints the median tokens/s of decoding N tokens after a prompt of P,
over R rounds, one number a line ("torch-compiled tgN: X tok/s"), so that
scripts/bench_decode_gpu.sh can alternate it with kiln in the same run.

    python3 scripts/bench_decode_torch.py [--prompt 512] [--gen 128] [--rounds 5] [--kiln 'CMD' ...]

The model and the compiled step stay in this process across rounds; the
first call compiles (not timed). Each --kiln CMD (a shell command printing
`kiln bench`'s table) runs once a round after the torch round, so peer and
kiln alternate in the same run; its tg row is picked out and the medians of
all are printed at the end. Needs torch and transformers on the GPU
machine (no network: the config is written out below).
"""
import argparse
import re
import statistics
import subprocess
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def smollm2_135m():
    return LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                       num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                       rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, hidden_act="silu")


def make_static_cache(cfg, max_len, dtype):
    """StaticCache's constructor changed across transformers releases."""
    from transformers import StaticCache
    tries = [
        dict(config=cfg, max_batch_size=1, max_cache_len=max_len, device="cuda", dtype=dtype),
        dict(config=cfg, max_cache_len=max_len),
        dict(config=cfg, batch_size=1, max_cache_len=max_len, device="cuda", dtype=dtype),
    ]
    err = None
    for kw in tries:
        try:
            return StaticCache(**kw)
        except TypeError as e:
            err = e
    raise err


@torch.no_grad()
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--kiln", action="append", default=[], help="shell command printing a kiln bench table")
    a = ap.parse_args()
    torch.manual_seed(0)
    cfg = smollm2_135m()
    dtype = torch.bfloat16
    model = LlamaForCausalLM(cfg).to(device="cuda", dtype=dtype).eval()
    max_len = a.prompt + a.gen + 8
    cache = make_static_cache(cfg, max_len, dtype)

    def step(tok, pos):
        out = model(input_ids=tok, position_ids=pos.unsqueeze(0), cache_position=pos,
                    past_key_values=cache, use_cache=True, return_dict=True)
        return out.logits[:, -1].argmax(-1, keepdim=True)

    step_c = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    prompt = torch.randint(0, cfg.vocab_size, (1, a.prompt), device="cuda")

    def decode():
        cache.reset()
        pos = torch.arange(a.prompt, device="cuda")
        model(input_ids=prompt, position_ids=pos.unsqueeze(0), cache_position=pos, past_key_values=cache, use_cache=True)
        tok = prompt[:, -1:].clone()
        p = torch.tensor([a.prompt], device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(a.gen):   # inputs stay on the device: no host copy, no sync in the loop
            tok = step_c(tok, p).clone()
            p += 1
        torch.cuda.synchronize()
        return a.gen / (time.perf_counter() - t0)

    t = time.perf_counter()
    decode()
    decode()   # the compile, the graph capture, then warm
    print(f"# torch {torch.__version__}, {torch.cuda.get_device_name()}, compile + warm-up {time.perf_counter() - t:.1f} s",
          flush=True)
    res = []
    kres = [[] for _ in a.kiln]
    for _ in range(a.rounds):
        r = decode()
        res.append(r)
        print(f"torch-compiled tg{a.gen}: {r:.1f} tok/s", flush=True)
        for j, cmd in enumerate(a.kiln):
            out = subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout
            m = [l for l in out.splitlines() if re.search(r"\btg%d\b" % a.gen, l)]
            v = float(m[-1].split("|")[-2].split()[0]) if m else float("nan")
            kres[j].append(v)
            print(f"kiln[{j}] tg{a.gen}: {v:.1f} tok/s   ({cmd})", flush=True)
    print(f"# torch-compiled median {statistics.median(res):.1f} tok/s (rounds: {' '.join(f'{x:.0f}' for x in res)})")
    for j, cmd in enumerate(a.kiln):
        print(f"# kiln[{j}] median {statistics.median(kres[j]):.1f} tok/s (rounds: {' '.join(f'{x:.0f}' for x in kres[j])}): {cmd}")


if __name__ == "__main__":
    sys.exit(main())
