/* qpack.h: quantized weight rows repacked 16 at a time, for matrix-vector
 * products whose SIMD lanes are weight rows (decode: one to a few activation
 * rows against every weight row).
 *
 * Why: the row-at-a-time dots (quant16_avx2.c) spend most of their
 * instructions on what is not a multiply: widening a 32-element block, one
 * float scale per block and row, a horizontal sum per row. With 16 rows
 * interleaved, one vpdpwssd multiplies a pair of activation quants into all
 * 16 rows at once, the 16 rows' scales of a block are one vector, and the 16
 * results are stored as they are: the kernel is bound by memory, not by
 * instructions (llama.cpp repacks Q4_0 the same way, "q4_0_8x8").
 *
 * Layout: rows are taken in groups of 16 (the last group padded with zero
 * rows). A group is K/32 block records in order; the record of block b is
 *   Q8_0  d[16] (f16 bits)                    32 B | q[16 chunks][16 rows][2]  512 B
 *   Q4_0  d[16]                               32 B | n[8 chunks][16 rows][2]   256 B
 *   Q4_1  d[16], m[16]                        64 B | n[8 chunks][16 rows][2]   256 B
 *   Q5_0  d[16]                               32 B | n as Q4                   256 B |
 *                                                    h[16 rows][2] (uint16)     64 B
 *   Q5_1  d[16], m[16]                        64 B | n, h as Q5_0              320 B
 *   Q4_K  (a record is the file's super-block of 256) d[16], dmin[16],
 *         sc[8][16], m[8][16] (the 6-bit scales and mins as bytes)  320 B |
 *         8 sub-blocks of 32, each as a Q4 quant part               2048 B
 *   Q5_K  Q4_K's 320 B | 8 sub-blocks of 32, each as a Q5 quant part
 *         (nibbles and bit plane)                                   2560 B
 *   Q6_K  (a record is the super-block of 256) d[16] 32 B, sc[16][16]
 *         (the int8 scales of the 16-element sub-blocks) 256 B | 8 parts
 *         of 32, each: n as Q4 (the low 4 bits) 256 B, h0[16 rows][2],
 *         h1[16 rows][2] (uint16: the high 2 bits) 128 B        3360 B
 * Q8_0 chunk c holds row r's elements 2c and 2c+1 (signed bytes) at bytes
 * 2r, 2r+1: widened to int16 they are lane r's pair in vpdpwssd. Q4 chunk c
 * holds in byte 2r+j the nibble of element 2c+j (low) and of element
 * 2(c+8)+j (high), both the unsigned 0..15 quants of the file. Q5's fifth
 * bits: bit c of h[2r + j] belongs to element 2c + j, bit 8 + c to element
 * 2(c+8)+j, so h loaded as a vector lines up with a widened chunk's int16
 * lanes and chunk c takes its bits by shifting h by c. Q6_K's h0 holds in
 * bits 2c, 2c+1 of lane 2r+j the high bits of element 2c+j, h1 those of
 * element 2(c+8)+j. Every record
 * has the size of 16 of the file's blocks (Q4_K: 2368 B for 2304, Q5_K 2880 for 2816: the
 * unpacked scale bytes), so a packed matrix takes as many bytes as the
 * file's (plus the padding rows).
 *
 * Dots are with Q16 activations (quant.h: kn_block_q16), the CPU's default
 * for these types: per block, the exact int32 sum of the 32 products, then
 *   y += (dw * da) * sum                      Q8_0
 *   y += dw * (da * sum - 8 * s)              Q4_0  (s = da * sum of quants)
 *   y += dw * (da * sum - 16 * s)             Q5_0
 *   y += (dw * da) * sum + mw * s             Q4_1, Q5_1
 *   y += dw * sc_j * da * sum - dmin * m_j * s  Q4_K, Q5_K, sub-block j
 *   y += dw * da * (sc_2j sum_lo + sc_2j+1 sum_hi)  Q6_K, part j: the sums
 *        of its elements 0-15 and 16-31, each quant minus 32 in the ints
 * The scalar kernel here is the oracle of the SIMD one (same sums, the same
 * float steps; results agree to rounding of the float accumulation).
 */
#ifndef KN_QPACK_H
#define KN_QPACK_H

#include "backends/quant/quant.h"   /* defines: kn_block_q16, kn_block_q4_0, ... */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KN_QPACK_ROWS 16

/* Types with a packed layout (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K). */
bool kn_qpack_type_ok(kn_dtype t);
/* Bytes of a packed matrix of `rows` rows of K elements (K a multiple of
 * the type's block). */
size_t kn_qpack_nbytes(kn_dtype t, int64_t rows, int64_t K);
/* Pack groups [g0, g1) of a matrix of `rows` rows (row r at src + r *
 * row_bytes, K elements) into dst (the whole packed matrix). */
void kn_qpack_pack(kn_dtype t, const void *src, size_t row_bytes, int64_t rows, int64_t K, int64_t g0, int64_t g1,
                   void *dst);
/* y[16 (g1 - g0)] = the packed groups [g0, g1) (rows 16 g0 ..) times the
 * Q16 activation row x (K / 32 blocks). */
typedef void (*kn_qpack_gemv_fn)(const void *packed, int64_t g0, int64_t g1, int64_t K, const kn_block_q16 *x,
                                 float *y);
/* The scalar kernel (the oracle), and the SIMD one or NULL where the CPU or
 * the build has none (the packed path is then not taken). */
kn_qpack_gemv_fn kn_qpack_gemv_scalar(kn_dtype t);
kn_qpack_gemv_fn kn_qpack_gemv_simd(kn_dtype t);
/* Four activation rows against group g: row i of x starts xs blocks after
 * row i - 1; y[i * ldy + r] = weight row 16 g + r times activation row i.
 * Each output has the bits of the one-row SIMD kernel's (the same steps);
 * the weights are widened once for the four. NULL where the CPU has none. */
typedef void (*kn_qpack_gemm4_fn)(const void *packed, int64_t g, int64_t K, const kn_block_q16 *x, int64_t xs,
                                  float *y, int64_t ldy);
kn_qpack_gemm4_fn kn_qpack_gemm4_simd(kn_dtype t);
/* Rows [16 g, 16 g + 16) of the packed matrix as floats, transposed:
 * out[k * ldo + r] = W[16 g + r, k] (so the groups of a matrix fill W^T
 * [K, ldo], the SGEMM's right operand for prefill). The same values as
 * kn_dequantize_row of the file's rows. The best kernel this CPU has. */
typedef void (*kn_qpack_dequant_fn)(const void *packed, int64_t g, int64_t K, float *out, int64_t ldo);
kn_qpack_dequant_fn kn_qpack_dequant(kn_dtype t);
kn_qpack_dequant_fn kn_qpack_dequant_scalar(kn_dtype t);

#ifndef KN_NO_AVX512
kn_qpack_gemv_fn kn_qpack_avx512_gemv(kn_dtype t);   /* qpack_avx512.c (AVX512-VNNI) */
kn_qpack_gemm4_fn kn_qpack_avx512_gemm4(kn_dtype t);
kn_qpack_dequant_fn kn_qpack_avx512_dequant(kn_dtype t);
#endif

#endif
