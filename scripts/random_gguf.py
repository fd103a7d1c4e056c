"""random_gguf.py: random weights written straight as GGUF quantized blocks
(Q4_0, Q8_0), for benchmark models of real sizes (scripts/make_random_qwen_gguf.py
--real, make_random_moe_gguf.py --real): drawing bytes is far faster than
drawing floats and quantizing them, and a timing does not care which values
the blocks hold. Each block's scale is set so the weights have about the
standard deviation `std` (1/sqrt(in) for a matrix), as a trained model's do,
so activations stay finite."""
import numpy as np
from gguf import GGMLQuantizationType as Q

# bytes per block of 32 weights; the spread of the quantized integers
BLOCK = {Q.Q4_0: (18, 4.6), Q.Q8_0: (34, 73.6)}   # Q4_0: q - 8 with q in 0..15; Q8_0: int8


def rand_quant(rng, shape, qt, std=None):
    """a tensor of logical shape [..., rows, cols] (cols a multiple of 32) as
    the uint8 array GGUFWriter.add_tensor(name, a, raw_dtype=qt) takes"""
    *lead, cols = shape
    nb, (bs, spread) = cols // 32, BLOCK[qt]
    a = rng.integers(0, 256, size=(*lead, nb, bs), dtype=np.uint8)
    d = np.float16((std if std else 1 / np.sqrt(cols)) / spread)
    a[..., 0:2] = np.frombuffer(d.tobytes(), np.uint8)
    return a.reshape(*lead, nb * bs)


def placeholder_vocab(w, V):
    """V placeholder pieces (the benchmark feeds token ids)"""
    w.add_tokenizer_model("llama")
    w.add_token_list([f"t{i}" for i in range(V)])
    w.add_token_scores([0.0] * V)
    w.add_token_types([1] * V)
