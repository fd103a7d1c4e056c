/* rand_gguf.c: a random-weight llama GGUF with quantized matrices, for GPU
 * benchmarks of --gpu-dtype file on machines without model files (the device
 * machine reaches nothing; a 94 MB file does not travel in one call).
 *
 *   rand_gguf OUT.gguf TYPE C LAYERS HEADS KV_HEADS FFN VOCAB
 *   rand_gguf /tmp/smol.gguf q4_0 576 30 9 3 1536 49152     # SmolLM2-135M's shape
 *   rand_gguf /tmp/l1b.gguf q4_k_m 2048 16 32 8 8192 32000  # a Llama-3.2-1B-like shape
 *
 * TYPE: q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k, bf16, f16 (every
 * matrix), or q4_k_m (llama.cpp's mix: Q4_K, attn_v / ffn_down / embedding
 * Q6_K). scripts/make_random_llm_gguf.sh names the shapes (Llama-2-7B,
 * Llama-3-8B, ...). Norms
 * f32, tied output, a placeholder "gpt2" vocabulary ("t0".."tV-1") that
 * `kiln bench` does not need. Weights uniform in +-1.7/sqrt(in): the numbers
 * mean nothing, the bytes read per token are a real model's.
 * Build: cc -O2 -fopenmp -Iinclude -Isrc dev/quant/rand_gguf.c build/libkiln.a -lm -lpthread -lz
 * (a CUDA build's libkiln.a needs -L/usr/local/cuda/lib64 -lcudart -lcublas -lnvrtc -lstdc++ too)
 */
#include "kiln.h"
#include "backends/quant/quant.h"    // defines: kn_quantize_row
#include "formats/gguf_write.h"      // defines: kn_gguf_writer
#include "core/fp16.h"               // defines: kn_fp32_to_bf16, kn_fp32_to_fp16
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float urand(uint64_t *s) {   /* xorshift64*, [-1, 1) */
    *s ^= *s >> 12; *s ^= *s << 25; *s ^= *s >> 27;
    return (float)((double)((*s * 2685821657736338717ull) >> 11) / 9007199254740992.0 * 2 - 1);
}

/* the caller frees *keep after the file is written */
static int put_mat(kn_gguf_writer *w, const char *name, kn_dtype t, int64_t rows, int64_t cols, void **keep) {
    size_t rb = kn_dtype_nbytes(t, cols);
    char *q = malloc(rb * (size_t)rows);
    *keep = q;
    if (!q) { fprintf(stderr, "out of memory\n"); return 1; }
    float a = 1.7f / sqrtf((float)cols);
    uint64_t h = 1469598103934665603ull;
    for (const char *c = name; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
    int bad = 0;
    /* rows in parallel (-fopenmp): each row's numbers from its own seed */
#pragma omp parallel for schedule(dynamic, 64) reduction(| : bad)
    for (int64_t r = 0; r < rows; r++) {
        float *f = malloc(sizeof(float) * (size_t)cols);
        uint64_t s = h ^ ((uint64_t)r * 0x9E3779B97F4A7C15ull) ^ 0x5851F42D4C957F2Dull;
        if (!f) { bad = 1; continue; }
        for (int64_t i = 0; i < cols; i++) f[i] = a * urand(&s);
        if (t == KN_BF16 || t == KN_F16) {        /* 16-bit matrices: rounded, not quantized */
            uint16_t *d = (uint16_t *)(q + rb * (size_t)r);
            for (int64_t i = 0; i < cols; i++) d[i] = t == KN_BF16 ? kn_fp32_to_bf16(f[i]) : kn_fp32_to_fp16(f[i]);
        } else if (kn_quantize_row(t, f, q + rb * (size_t)r, cols)) bad = 1;
        free(f);
    }
    if (bad) { fprintf(stderr, "quantizing %s failed: %s\n", name, kn_last_error()); return 1; }
    kn_gguf_w_tensor(w, name, t, 2, (int64_t[]){cols, rows}, q);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 9) { fprintf(stderr, "usage: rand_gguf OUT.gguf TYPE C LAYERS HEADS KV_HEADS FFN VOCAB\n"); return 2; }
    const char *out = argv[1], *ty = argv[2];
    int C = atoi(argv[3]), L = atoi(argv[4]), H = atoi(argv[5]), HKV = atoi(argv[6]), F = atoi(argv[7]), V = atoi(argv[8]);
    static const struct { const char *n; kn_dtype t; } types[] = {
        {"q4_0", KN_Q4_0}, {"q4_1", KN_Q4_1}, {"q5_0", KN_Q5_0}, {"q5_1", KN_Q5_1}, {"q8_0", KN_Q8_0},
        {"q4_k", KN_Q4_K}, {"q5_k", KN_Q5_K}, {"q6_k", KN_Q6_K}, {"q4_k_m", KN_Q4_K}, {"bf16", KN_BF16}, {"f16", KN_F16}};
    kn_dtype q = KN_F32;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) if (!strcmp(ty, types[i].n)) q = types[i].t;
    if (q == KN_F32 || C <= 0 || L <= 0 || H <= 0 || HKV <= 0 || F <= 0 || V <= 0 || C % H || H % HKV) {
        fprintf(stderr, "rand_gguf: bad TYPE or shape\n"); return 2;
    }
    bool mix = !strcmp(ty, "q4_k_m");
    kn_dtype q6 = mix ? KN_Q6_K : q;
    int D = C / H;
    kn_gguf_writer *w = NULL;
    if (kn_gguf_writer_new(&w)) return 1;
    kn_gguf_w_str(w, "general.architecture", "llama");
    kn_gguf_w_str(w, "general.name", "random");
    kn_gguf_w_u32(w, "llama.context_length", 8192);
    kn_gguf_w_u32(w, "llama.embedding_length", (uint32_t)C);
    kn_gguf_w_u32(w, "llama.block_count", (uint32_t)L);
    kn_gguf_w_u32(w, "llama.feed_forward_length", (uint32_t)F);
    kn_gguf_w_u32(w, "llama.attention.head_count", (uint32_t)H);
    kn_gguf_w_u32(w, "llama.attention.head_count_kv", (uint32_t)HKV);
    kn_gguf_w_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    kn_gguf_w_f32(w, "llama.rope.freq_base", 100000.f);
    char **names = malloc(sizeof(char *) * (size_t)V);
    size_t *lens = malloc(sizeof(size_t) * (size_t)V);
    for (int i = 0; i < V; i++) { names[i] = malloc(12); lens[i] = (size_t)snprintf(names[i], 12, "t%d", i); }
    kn_gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
    kn_gguf_w_arr_str(w, "tokenizer.ggml.tokens", (uint64_t)V, (const char *const *)names, lens);
    const char *mg[1] = {"t1 t2"};
    size_t ml[1] = {5};
    kn_gguf_w_arr_str(w, "tokenizer.ggml.merges", 1, mg, ml);
    void **keep = calloc((size_t)(7 * L + 1), sizeof(void *));
    float *ones = malloc(sizeof(float) * (size_t)C);
    for (int i = 0; i < C; i++) ones[i] = 1.f;
    int nk = 0, bad = put_mat(w, "token_embd.weight", q6, V, C, &keep[nk++]);
    kn_gguf_w_tensor_f32(w, "output_norm.weight", 1, (int64_t[]){C}, ones);
    char nm[96];
    for (int l = 0; l < L && !bad; l++) {
#define M(s, t, r, c) snprintf(nm, sizeof nm, "blk.%d." s ".weight", l); bad |= put_mat(w, nm, t, r, c, &keep[nk++]);
        M("attn_q", q, C, C) M("attn_k", q, (int64_t)HKV * D, C) M("attn_v", q6, (int64_t)HKV * D, C)
        M("attn_output", q, C, C) M("ffn_gate", q, F, C) M("ffn_up", q, F, C) M("ffn_down", q6, C, F)
#undef M
        snprintf(nm, sizeof nm, "blk.%d.attn_norm.weight", l);
        kn_gguf_w_tensor_f32(w, nm, 1, (int64_t[]){C}, ones);
        snprintf(nm, sizeof nm, "blk.%d.ffn_norm.weight", l);
        kn_gguf_w_tensor_f32(w, nm, 1, (int64_t[]){C}, ones);
    }
    kn_status st = bad ? KN_ERR_INVALID : kn_gguf_write_file(w, out);
    if (st) fprintf(stderr, "rand_gguf: %s\n", kn_last_error());
    else printf("wrote %s (%s, C %d, %d layers, F %d, V %d)\n", out, ty, C, L, F, V);
    kn_gguf_writer_free(w);
    for (int i = 0; i < nk; i++) free(keep[i]);
    for (int i = 0; i < V; i++) free(names[i]);
    free(keep); free(names); free(lens); free(ones);
    return st ? 1 : 0;
}
