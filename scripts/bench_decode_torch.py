"""bench_decode_torch.py: the GPU decode peer at its best, for `kiln bench`.

PyTorch decode of a Llama-shaped model (--shape: SmolLM2-135M's, the
default, or Llama-3-8B's; random bf16 weights: values do not change the
speed) with a static KV cache and torch.compile(mode="reduce-overhead")
(CUDA graphs), greedy, one token a step; and the prompt (prefill) of P
tokens through torch.compile (default mode; logits of the last position
only, as kiln computes them). Prints, each round, the tokens/s of the
prompt ("torch-compiled ppP: X tok/s") and of decoding N tokens after it
("torch-compiled tgN: X tok/s"), then medians over R rounds.

    python3 scripts/bench_decode_torch.py [--shape smollm2-135m|llama3-8b] [--save DIR]
                                          [--prompt 512] [--gen 128] [--rounds 5] [--kiln 'CMD' ...]

--save DIR writes the model (config.json + safetensors) before the rounds,
so that the --kiln commands can load the very same weights with -m DIR.

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


def llama3_8b():
    return LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                       rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, hidden_act="silu")


SHAPES = {"smollm2-135m": smollm2_135m, "llama3-8b": llama3_8b}


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
    ap.add_argument("--shape", default="smollm2-135m", choices=sorted(SHAPES))
    ap.add_argument("--save", default="", help="write the model here (Hugging Face directory) for the kiln commands")
    ap.add_argument("--kiln", action="append", default=[], help="shell command printing a kiln bench table")
    a = ap.parse_args()
    torch.manual_seed(0)
    cfg = SHAPES[a.shape]()
    dtype = torch.bfloat16
    # built on the device in bf16: an 8B model initialized on the host in f32 would take minutes and 32 GB
    torch.set_default_dtype(dtype)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).eval()
    torch.set_default_dtype(torch.float32)
    if a.save:
        t = time.perf_counter()
        model.save_pretrained(a.save, safe_serialization=True)
        print(f"# wrote {a.save} in {time.perf_counter() - t:.1f} s", flush=True)
    max_len = a.prompt + a.gen + 8
    cache = make_static_cache(cfg, max_len, dtype)

    def step(tok, pos):
        out = model(input_ids=tok, position_ids=pos.unsqueeze(0), cache_position=pos,
                    past_key_values=cache, use_cache=True, return_dict=True)
        return out.logits[:, -1].argmax(-1, keepdim=True)

    def prefill(ids, pos):
        kw = dict(input_ids=ids, position_ids=pos.unsqueeze(0), cache_position=pos, past_key_values=cache, use_cache=True)
        try:
            out = model(logits_to_keep=1, **kw)
        except TypeError:     # transformers before 4.50 calls it num_logits_to_keep
            out = model(num_logits_to_keep=1, **kw)
        return out.logits[:, -1].argmax(-1, keepdim=True)

    step_c = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    prefill_c = torch.compile(prefill)
    prompt = torch.randint(0, cfg.vocab_size, (1, a.prompt), device="cuda")
    # The cache's tensors must come to life outside compiled code. transformers
    # 5.x allocates a StaticCache's layers on their first update and marks them
    # as static addresses only when that update is not being traced; allocated
    # inside the compiled prefill they stay unmarked, every step mutates an
    # input the CUDA graph does not own, and the graphs are skipped: the step
    # then ran at ~100 tok/s for SmolLM2 and for an 8B model alike (kiln's
    # sessions 21-25, docs/PERF.md). One eager prompt (not timed) allocates them.
    with torch.no_grad():
        pos0 = torch.arange(a.prompt, device="cuda")
        model(input_ids=prompt, position_ids=pos0.unsqueeze(0), cache_position=pos0, past_key_values=cache, use_cache=True)
    cache.reset()
    pp = []

    def decode():
        cache.reset()
        pos = torch.arange(a.prompt, device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        prefill_c(prompt, pos)
        torch.cuda.synchronize()
        pp.append(a.prompt / (time.perf_counter() - t0))
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
    try:   # a step that runs without its CUDA graphs is not the peer at its best: say so in the output
        from torch._dynamo.utils import counters
        skips = dict(counters["inductor"]).get("cudagraph_skips", 0)
        if skips:
            print(f"# WARNING: torch.compile skipped CUDA graphs {skips} time(s); the tg rows are not the peer at its best",
                  flush=True)
    except Exception:
        pass
    res = []
    pp.clear()
    kres = [[] for _ in a.kiln]
    kpp = [[] for _ in a.kiln]

    def kiln_row(out, name):   # `kiln bench`'s table: "| model | ... | ppN | X ± Y |"
        m = [l for l in out.splitlines() if re.search(r"\b%s\b" % name, l)]
        try:
            return float(m[-1].split("|")[-2].split()[0])
        except (IndexError, ValueError):
            return float("nan")

    for _ in range(a.rounds):
        r = decode()
        res.append(r)
        print(f"torch-compiled pp{a.prompt}: {pp[-1]:.1f} tok/s", flush=True)
        print(f"torch-compiled tg{a.gen}: {r:.1f} tok/s", flush=True)
        for j, cmd in enumerate(a.kiln):
            p = subprocess.run(cmd, shell=True, capture_output=True, text=True)
            if p.returncode:
                sys.stdout.write(p.stderr[-1500:])
            kpp[j].append(kiln_row(p.stdout, f"pp{a.prompt}"))
            kres[j].append(kiln_row(p.stdout, f"tg{a.gen}"))
            print(f"kiln[{j}] pp{a.prompt}: {kpp[j][-1]:.1f} tok/s", flush=True)
            print(f"kiln[{j}] tg{a.gen}: {kres[j][-1]:.1f} tok/s   ({cmd})", flush=True)
    rounds = lambda xs: " ".join(f"{x:.0f}" for x in xs)
    print(f"# torch-compiled median pp{a.prompt} {statistics.median(pp):.1f} tok/s (rounds: {rounds(pp)})")
    print(f"# torch-compiled median {statistics.median(res):.1f} tok/s (rounds: {rounds(res)})")
    for j, cmd in enumerate(a.kiln):
        print(f"# kiln[{j}] median pp{a.prompt} {statistics.median(kpp[j]):.1f} tok/s (rounds: {rounds(kpp[j])}): {cmd}")
        print(f"# kiln[{j}] median {statistics.median(kres[j]):.1f} tok/s (rounds: {rounds(kres[j])}): {cmd}")


if __name__ == "__main__":
    sys.exit(main())
