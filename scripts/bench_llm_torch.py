"""bench_llm_torch.py: PyTorch (Hugging Face transformers, eager) prefill and
decode tokens/s for a Llama-shaped model on the GPU, next to `kiln bench
--backend cuda` (same token counts: a 512-token prefill, then 128 decode steps
from an empty cache, one token each, greedy on the GPU), plus the
device-to-device copy bandwidth that bounds decode (every step reads all
weights once).

The weights are randomly initialised from the config (no download; the GPU
machine has no network): their values do not change the speed. The default
config is SmolLM2-135M's (from its GGUF metadata).

    python3 scripts/bench_llm_torch.py [--prompt 512] [--gen 128] [--reps 3]
Prints one markdown row per (dtype, test): median tokens/s of reps.
"""
import argparse
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def smollm2_135m():
    return LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                       num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                       rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, hidden_act="silu")


def copy_bandwidth(nbytes=1 << 30, reps=20):
    x = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").normal_()
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        s.record()
        y.copy_(x)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    t = statistics.median(times)
    return 2 * nbytes / t, t


@torch.no_grad()
def bench(model, n_prompt, n_gen, reps, V):
    pp, tg = [], []
    ids = torch.randint(0, V, (1, n_prompt), device="cuda")
    for r in range(reps + 1):                       # the first round warms up
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model(input_ids=ids, use_cache=True, logits_to_keep=1)   # kiln projects the last row only too
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        out = model(input_ids=ids[:, :1], use_cache=True)
        cache = out.past_key_values
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        for _ in range(n_gen):
            out = model(input_ids=tok, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
        tok.item()
        t3 = time.perf_counter()
        if r:
            pp.append(n_prompt / (t1 - t0))
            tg.append(n_gen / (t3 - t2))
    return statistics.median(pp), statistics.median(tg)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    torch.manual_seed(0)
    bw, t = copy_bandwidth()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}; device-to-device copy "
          f"{bw / 1e12:.2f} TB/s (read + write, 1 GiB, {t * 1e3:.3f} ms)")
    cfg = smollm2_135m()
    print("| framework | weights | test | tokens/s (median of %d) |\n|---|---|---|---|" % a.reps)
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        model = LlamaForCausalLM(cfg).to(device="cuda", dtype=dt).eval()
        pp, tg = bench(model, a.prompt, a.gen, a.reps, cfg.vocab_size)
        name = str(dt).replace("torch.", "")
        print(f"| transformers eager | {name} | pp{a.prompt} | {pp:.1f} |")
        print(f"| transformers eager | {name} | tg{a.gen} | {tg:.1f} |", flush=True)
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
