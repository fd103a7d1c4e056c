"""llmref_common.py: what scripts/qwen_ref.py, arch_ref.py and moe_ref.py
share when they write the transformers fixtures of the LLM tests: the
Hugging Face directory of a model (config.json + model.safetensors, bf16),
GGUF tensors in llama.cpp's layout, the byte-level BPE symbols, and the KNLR
v2 reference file (the format is described in scripts/llm_ref.py; read by
tests/kn_llmref.h).
"""
import copy, os, shutil, struct, sys
import numpy as np
import torch


def save_hf(model, d):
    """model as a Hugging Face directory d: only what kiln reads. A copy is
    converted: .to(bf16) would also round the rotary buffers, which the
    reference keeps as transformers computes them (float32)."""
    shutil.rmtree(d, ignore_errors=True)
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
    for extra in os.listdir(d):
        if extra not in ("config.json", "model.safetensors"):
            os.remove(os.path.join(d, extra))


def byte_symbols():
    """GPT-2's byte-level alphabet: the symbol of each byte 0..255, in byte order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b); cs.append(256 + n); n += 1
    byte_tok = {b: chr(c) for b, c in zip(bs, cs)}
    return [byte_tok[b] for b in range(256)]


def permute_rows(w, n_head):
    """HF q/k rows (halves rotated) -> llama.cpp's order (pairs rotated)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_bf16(w, name, a):
    """a weight matrix stored as BF16"""
    import gguf
    w.add_tensor(name, gguf.quants.quantize(np.ascontiguousarray(a), gguf.GGMLQuantizationType.BF16),
                 raw_dtype=gguf.GGMLQuantizationType.BF16)


def gguf_f32(w, name, a):
    """a norm gain, bias or factor vector stored as F32"""
    w.add_tensor(name, np.ascontiguousarray(a, dtype=np.float32))


def write_ref(m64, prompts, path, n_gen, rows):
    """KNLR v2: per prompt, the logits of its last `rows` positions and the
    greedy continuation of n_gen tokens (full forward each step) with each
    step's top-2 margin, from the float64 model m64."""
    V = m64.config.get_text_config().vocab_size
    with open(path, "wb") as f:
        f.write(b"KNLR" + struct.pack("<III", 2, len(prompts), V))
        for p in prompts:
            logits = m64(torch.tensor([p])).logits[0]                           # [T, V]
            ids, gen, margin = list(p), [], []
            for _ in range(n_gen):
                last = m64(torch.tensor([ids])).logits[0, -1]
                top = torch.topk(last, 2).values
                nxt = int(torch.argmax(last))
                gen.append(nxt); margin.append(float(top[0] - top[1])); ids.append(nxt)
            r = min(rows, len(p))
            f.write(struct.pack("<III", len(p), n_gen, r))
            f.write(struct.pack(f"<{len(p)}i", *p))
            f.write(struct.pack(f"<{n_gen}i", *gen))
            f.write(struct.pack(f"<{n_gen}f", *margin))
            f.write(logits[-r:].to(torch.float32).numpy().astype("<f4").tobytes())
            print(f"  prompt {p[:6]}... greedy {gen[:10]}... min margin {min(margin):.3f}", file=sys.stderr)
