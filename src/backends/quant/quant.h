/* quant.h: GGUF/ggml block-quantized types, (de)quantization, and the CPU
 * dot products the model code uses for quantized matrix-vector products.
 *
 * The block structs below are bit-for-bit the ggml/GGUF layouts, so tensors in a
 * memory-mapped GGUF file are used in place. A weight row of type t is dotted
 * with an activation row that the caller first quantizes to
 * kn_quant_vec_dot_type(t) (Q8_0, Q8_1, Q8_K or F32) with kn_quantize_row.
 *
 *   kn_dtype at = kn_quant_vec_dot_type(KN_Q4_0);            // KN_Q8_0
 *   void *aq = malloc(kn_dtype_nbytes(at, n));
 *   if (kn_quantize_row(at, x, aq, n) != KN_OK) ...            // x: [n] f32
 *   kn_quant_matvec_rows(KN_Q4_0, n, W, row_bytes, aq, y, 0, rows);
 *
 * Every dot has a scalar reference (the oracle) and AVX2 / AVX-512 versions
 * picked at run time from kn_cpu() (KN_CPU=scalar|avx2 caps it; tests can also
 * call kn_quant_force_isa). Non-goals: importance-matrix quantization, the
 * ggml search-based K-quant quantizers (ours are plain round-to-nearest),
 * Q2_K/Q3_K/IQ types.
 *
 * Alignment: rows (w, a, each W row) must start 4-byte aligned (the f32/q8_K
 * fields are read as float); GGUF tensor data is 32-byte aligned.
 *
 * Activation contract: the int8 quants of Q8_0/Q8_1/Q8_K activations must lie
 * in [-127, 127] (kn_quantize_row guarantees it); the SIMD sign trick relies on
 * it. Weight blocks may hold any bit pattern.
 *
 * Internal header (src/); kernels for each ISA are declared at the bottom.
 */
#ifndef KN_QUANT_H
#define KN_QUANT_H
#include "kiln_base.h"

#define KN_QK 32          /* elements per block of the Q4_0 .. Q8_1 types    */
#define KN_QK_K 256       /* elements per super-block of the K types         */

/* fp16 fields are raw IEEE half bits (uint16_t), little-endian as in the file. */
typedef struct { uint16_t d; uint8_t qs[KN_QK / 2]; } kn_block_q4_0;
/* x[j] = d * ((qs[j] & 15) - 8), x[j + 16] = d * ((qs[j] >> 4) - 8), j < 16     */
typedef struct { uint16_t d, m; uint8_t qs[KN_QK / 2]; } kn_block_q4_1;
/* x = d * q + m, q the nibble as above (unsigned)                               */
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[KN_QK / 2]; } kn_block_q5_0;
/* 5th bit of element i is bit i of the little-endian uint32 qh; x = d*(q-16)     */
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[KN_QK / 2]; } kn_block_q5_1;
/* x = d * q + m                                                                 */
typedef struct { uint16_t d; int8_t qs[KN_QK]; } kn_block_q8_0;
typedef struct { uint16_t d, s; int8_t qs[KN_QK]; } kn_block_q8_1;
/* s = d * sum(qs) (fp16), used by the Q4_1/Q5_1 dots for the min term            */

/* Q4_K: 8 sub-blocks of 32; x = d*sc[j]*q - dmin*m[j], sc/m 6-bit packed in
 * scales[12]: j<4: sc = s[j]&63, m = s[j+4]&63; j>=4: sc = (s[j+4]&15) |
 * (s[j-4]>>6)<<4, m = (s[j+4]>>4) | (s[j]>>6)<<4. qs: 4 chunks of 64 elements,
 * each 32 bytes: low nibbles = first 32 elements, high nibbles = next 32.       */
typedef struct {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qs[KN_QK_K / 2];
} kn_block_q4_K;
/* Q5_K: as Q4_K plus qh[32]: the 5th bit of element 32*i + l is bit i of qh[l]. */
typedef struct {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qh[KN_QK_K / 8];
    uint8_t qs[KN_QK_K / 2];
} kn_block_q5_K;
/* Q6_K: 16 sub-blocks of 16, x = d * scales[j] * (q - 32), q 6 bits. Two halves
 * of 128; in half h (ql += 64h, qh += 32h), for l < 32:
 *   e = l:      ql[l] & 15    | (qh[l] >> 0 & 3) << 4
 *   e = l + 32: ql[l+32] & 15 | (qh[l] >> 2 & 3) << 4
 *   e = l + 64: ql[l] >> 4    | (qh[l] >> 4 & 3) << 4
 *   e = l + 96: ql[l+32] >> 4 | (qh[l] >> 6 & 3) << 4
 * and element e of half h uses scales[8h + e/16].                               */
typedef struct {
    uint8_t ql[KN_QK_K / 2];
    uint8_t qh[KN_QK_K / 4];
    int8_t scales[KN_QK_K / 16];
    uint16_t d;
} kn_block_q6_K;
/* 6-bit quant e (0..255) of a Q6_K block, 0..63 (not yet minus 32) */
static inline int kn_q6k_at(const kn_block_q6_K *b, int e) {
    int h = e >> 7, l = e & 31, g = (e >> 5) & 3;      /* half, lane, group as above */
    const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
    int lo = (g & 1) ? ql[l + 32] : ql[l];
    lo = (g & 2) ? lo >> 4 : lo & 15;
    return lo | ((qh[l] >> (2 * g)) & 3) << 4;
}
/* Q8_K: activations for the K dots; d is f32, bsums[j] = sum of qs[16j..16j+15]. */
typedef struct {
    float d;
    int8_t qs[KN_QK_K];
    int16_t bsums[KN_QK_K / 16];
} kn_block_q8_K;

/* 6-bit scale j and min j (j < 8) of a Q4_K/Q5_K block's scales[12]. */
static inline void kn_q45k_sc_m(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) { *sc = s[j] & 63; *m = s[j + 4] & 63; }
    else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

_Static_assert(sizeof(kn_block_q4_0) == 18, "q4_0 layout");
_Static_assert(sizeof(kn_block_q4_1) == 20, "q4_1 layout");
_Static_assert(sizeof(kn_block_q5_0) == 22, "q5_0 layout");
_Static_assert(sizeof(kn_block_q5_1) == 24, "q5_1 layout");
_Static_assert(sizeof(kn_block_q8_0) == 34, "q8_0 layout");
_Static_assert(sizeof(kn_block_q8_1) == 36, "q8_1 layout");
_Static_assert(sizeof(kn_block_q4_K) == 144, "q4_K layout");
_Static_assert(sizeof(kn_block_q5_K) == 176, "q5_K layout");
_Static_assert(sizeof(kn_block_q6_K) == 210, "q6_K layout");
_Static_assert(sizeof(kn_block_q8_K) == 292, "q8_K layout");

/* A dot of n elements (a multiple of the block size): weight row w, activations a. */
typedef float (*kn_vec_dot_fn)(int64_t n, const void *w, const void *a);

/* ---- public (to the rest of kiln) ------------------------------------------ */

/* Dequantize n elements (multiple of the block size) of type t to f32. Also
 * handles KN_F32/F16/BF16. KN_ERR_INVALID on a bad n or NULL pointer,
 * KN_ERR_UNSUPPORTED for other dtypes. */
kn_status kn_dequantize_row(kn_dtype t, const void *src, float *dst, int64_t n);
/* Quantize f32 to t (every quantized type above, and F32/F16/BF16).
 * Round-to-nearest; non-finite inputs give KN_ERR_INVALID. */
kn_status kn_quantize_row(kn_dtype t, const float *src, void *dst, int64_t n);
/* Activation type weight type t pairs with in vec_dot: Q8_0 for Q4_0/Q5_0/Q8_0,
 * Q8_1 for Q4_1/Q5_1, Q8_K for the K types, F32 for F32/F16/BF16; KN_DTYPE_COUNT
 * for a type with no dot. */
kn_dtype kn_quant_vec_dot_type(kn_dtype t);
/* dot(weight row w of type t, activation row a of type kn_quant_vec_dot_type(t)),
 * n elements. On bad arguments returns NaN and sets kn_last_error(). */
float kn_quant_vec_dot(kn_dtype t, int64_t n, const void *w, const void *a);
/* y[r] = dot(W row r, a) for r in [r0, r1): W is rows of n elements of type t
 * with row stride row_bytes; a already quantized to the vec_dot type. Callers
 * split rows over threads (disjoint [r0, r1) ranges are safe to run at once).
 * On bad arguments sets kn_last_error() and writes NaN to y[r0..r1) (when the
 * range itself is valid). */
void kn_quant_matvec_rows(kn_dtype t, int64_t n, const void *W, size_t row_bytes,
                          const void *a, float *y, int64_t r0, int64_t r1);
/* The dot kn_quant_vec_dot uses for weight type t on this CPU, NULL if none. */
kn_vec_dot_fn kn_quant_dot_fn(kn_dtype t);
/* Internal, for tests: force a path (KN_ISA_SCALAR/AVX2/AVX512 from
 * src/core/cpu.h), capped at what kn_cpu() allows; -1 = auto. Not thread-safe
 * against concurrent dots: set it before starting work. */
void kn_quant_force_isa(int isa);
/* The path kn_quant_vec_dot uses now (after force/cap). */
int kn_quant_isa(void);
/* Internal, for tests: 1 = do not use AVX512-VNNI even where the CPU has it
 * (runs the vpmaddubsw AVX-512 variants); 0 = auto. */
void kn_quant_force_no_vnni(int on);


/* ---- 16-bit activations (quant16.c) ------------------------------------------
 * The default partner of every block-quantized weight type in the matmuls:
 * 8-bit activation quants (above, as llama.cpp does) round each element by
 * up to amax/254 of its block, which on SmolLM2 moves logits enough to flip
 * near ties within a few greedy steps; 16-bit quants round by amax/65534 and
 * cost about the same in the AVX2 kernels (weights widen to int16 and go
 * through vpmaddwd instead of vpmaddubsw). One block per 32 activations; the
 * K types (256-element super-blocks) read 8 consecutive blocks.               */
typedef struct { float d, s; int16_t qs[KN_QK]; } kn_block_q16;
/* x[j] ~ d * qs[j], qs in [-32767, 32767]; s = d * sum(qs)                      */
_Static_assert(sizeof(kn_block_q16) == 72, "q16 layout");

/* Which activations the CPU matmuls pair with quantized weights, from
 * KN_QMM_ACT: auto (default) = Q16 for the 32-element block types (their Q16
 * dots run as fast as the 8-bit ones) and the 8-bit partner for the K types
 * (whose Q16 dots are 1.5-2.4x slower); q16 = Q16 for every type; q8 = the
 * 8-bit partners (llama.cpp's choice); f32 = weights dequantized and SGEMM
 * (exact, slow for one row; KN_QMM_EXACT=1 is a synonym). Read once. */
typedef enum { KN_QACT_AUTO, KN_QACT_Q8, KN_QACT_Q16, KN_QACT_F32 } kn_qact;
kn_qact kn_quant_act_mode(void);
/* The mode for the values of KN_QMM_ACT and KN_QMM_EXACT (either may be NULL). */
kn_qact kn_quant_act_mode_parse(const char *act, const char *exact);
/* The Q16 dot the current mode picks for weight type t, NULL where it picks
 * the 8-bit partner (or f32). */
kn_vec_dot_fn kn_quant_act_q16_dot(kn_dtype t);
/* Internal, for tests: force a mode (-1 = back to the environment's). */
void kn_quant_force_act_mode(int mode);
/* Bytes of the Q16 form of n activations (n a multiple of 32). */
size_t kn_quant_q16_nbytes(int64_t n);
/* Quantize n floats (a multiple of 32, all finite: checked) to Q16. */
kn_status kn_quantize_q16(const float *x, kn_block_q16 *y, int64_t n);
/* The dot of weight type t with Q16 activations on this CPU: the SIMD kernel
 * where one exists, the scalar one on a CPU without AVX2, and NULL where a
 * SIMD CPU has no Q16 kernel for t (callers then use the 8-bit partner, which
 * is faster than the scalar Q16 dot). */
kn_vec_dot_fn kn_quant_q16_dot(kn_dtype t);
/* The scalar Q16 dot (the oracle of the SIMD ones; any quantized t), or NULL. */
kn_vec_dot_fn kn_quant_q16_dot_scalar(kn_dtype t);
/* y[r] = dot(w, activation row r) for r < 4, the Q16 rows `as` bytes apart:
 * the weight row is decoded once for the four (batched decode). Sums in
 * another order than kn_vec_dot_fn's (rounding of the last bit differs). */
typedef void (*kn_vec_dot4_fn)(int64_t n, const void *w, const void *a, size_t as, float *y);
/* The four-row Q16 dot for weight type t on this CPU, NULL where there is
 * none (the K types, a CPU without AVX2): callers use the single dot. */
kn_vec_dot4_fn kn_quant_q16_dot4(kn_dtype t);

/* Decode reads each weight once, from DRAM for a model larger than the
 * caches, and without help the core waited on memory, then computed
 * (1B-shaped Q4_K_M: 7.8 GB/s a thread from DRAM against 20.7 hot). The
 * decode kernels (packed records, qpack_avx512.c; weight rows, the CPU
 * backend's row dots) prefetch the n bytes at p + KN_QUANT_PREFETCH, ahead of
 * the n bytes at p they are about to read. Measured flat from 3 to 8 KiB; 2
 * threads: Llama-3.2-1B-shaped Q4_K_M tg 18.9 -> 25.0 tok/s, Qwen2.5-0.5B
 * Q4_0 58 -> 99 (row dots 39 -> 52, AVX2 kernels alike), SmolLM2 Q4_0 415 ->
 * 453-480, four-row pp4 66 -> 75. Past the end of a buffer a prefetch is a
 * hint that touches nothing. */
#define KN_QUANT_PREFETCH 4096
static inline void kn_quant_prefetch(const void *p, size_t n) {
    for (size_t l = 0; l < n; l += 64) __builtin_prefetch((const char *)p + KN_QUANT_PREFETCH + l);
}

/* ---- kernels (internal) -----------------------------------------------------
 * All take n a multiple of the block size (checked by the callers above).     */

#if (defined(__x86_64__) || defined(__i386__)) && !defined(KN_NO_X86)
#define KN_QUANT_X86 1
/* quant_avx2.c: entry for type t, NULL if there is no AVX2 kernel. */
kn_vec_dot_fn kn_quant_avx2_dot(kn_dtype t);
/* quant16_avx2.c: Q16 dot for weight type t, NULL if there is none. */
kn_vec_dot_fn kn_quant_q16_avx2_dot(kn_dtype t);
kn_vec_dot4_fn kn_quant_q16_avx2_dot4(kn_dtype t);
/* AVX2 Q16 quantizer (bit-identical to the scalar one); false on a non-finite x. */
bool kn_quant_q16_avx2(const float *x, kn_block_q16 *y, int64_t nb);
/* AVX2 activation quantizers, bit-identical to the scalar quant_q8_0/q8_1:
 * nb blocks of 32 floats (all finite: checked by the caller). */
void kn_quant_q8_0_avx2(const float *x, void *y, int64_t nb);
void kn_quant_q8_1_avx2(const float *x, void *y, int64_t nb);
#ifndef KN_NO_AVX512
#define KN_QUANT_AVX512 1
/* quant_avx512.c: entry for type t (vnni picks vpdpbusd), NULL if none. */
kn_vec_dot_fn kn_quant_avx512_dot(kn_dtype t, int vnni);
#endif
#endif

#endif
