/* gemm_bf16_avx512.c: the AMX and AVX512_BF16 micro-kernels of gemm_bf16.c.
 * C[32,32] (f32) = (acc ? C : 0) + A @ B over kp k-pairs (a multiple of 16):
 * Ap row-major [32][2 kp] bf16, Bp [kp][32] pair words. Tiles: 0-3 hold C
 * (rows 0-15 / 16-31 x columns 0-15 / 16-31), 4-5 the A rows of a 32-k step,
 * 6-7 the B columns of that step (16 pair rows of 64 bytes each, read with
 * the panel's 128-byte pair-row stride). Each step: four loads, four
 * TDPBF16PS (16 x 16 x 32 multiply-adds each).
 * Compiled in the AVX-512 build only; the AMX instructions come from the
 * target attribute (no file-wide -mamx flags: nothing else here may use
 * them). Called only after the OS granted the tile state (gemm_bf16.c). */
#include "backends/cpu/gemm.h"   // defines: kn_bgemm_ukr_fn
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

/* LDTILECFG's 64-byte layout: palette 1, then per tile its bytes per row and rows */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) tilecfg;

static _Thread_local bool t_configured;   /* the config stays loaded in this thread */

__attribute__((target("amx-tile,amx-bf16")))
void kn_bgemm_ukr_32x32_amx(int64_t kp, const uint32_t *Ap, const uint32_t *Bp, float *C, int64_t ldc, bool acc) {
    if (!t_configured) {
        tilecfg cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.palette = 1;
        for (int t = 0; t < 8; t++) { cfg.rows[t] = 16; cfg.colsb[t] = 64; }
        _tile_loadconfig(&cfg);
        t_configured = true;
    }
    const uint16_t *a = (const uint16_t *)Ap;
    const int64_t sa = 2 * kp * 2;                 /* bytes between A rows */
    if (acc) {
        _tile_loadd(0, C, ldc * 4);
        _tile_loadd(1, C + 16, ldc * 4);
        _tile_loadd(2, C + 16 * ldc, ldc * 4);
        _tile_loadd(3, C + 16 * ldc + 16, ldc * 4);
    } else {
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    }
    for (int64_t p = 0; p < kp; p += 16) {
        _tile_loadd(4, a + 2 * p, sa);
        _tile_loadd(5, a + 16 * 2 * kp + 2 * p, sa);
        _tile_loadd(6, Bp + p * 32, 128);
        _tile_loadd(7, Bp + p * 32 + 16, 128);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, C, ldc * 4);
    _tile_stored(1, C + 16, ldc * 4);
    _tile_stored(2, C + 16 * ldc, ldc * 4);
    _tile_stored(3, C + 16 * ldc + 16, ldc * 4);
}

/* The AVX512_BF16 micro-kernel, for CPUs with that and no AMX (AMD Zen 4 and
 * 5): the same 32 x 32 block, panels and result, as four groups of 8 rows.
 * A group keeps its 8 x 32 block of C in 16 zmm accumulators and walks the
 * k-pairs: two loads of B's pair row (32 words), then per row one
 * VDPBF16PS a half with A's pair broadcast (a[i][2p], a[i][2p+1] as one
 * word). Each instruction does 32 multiply-adds where an FMA does 16.
 * Numerics as AMX: products exact, sums rounded to f32, denormals flushed. */
void kn_bgemm_ukr_32x32_dpbf16(int64_t kp, const uint32_t *Ap, const uint32_t *Bp, float *C, int64_t ldc, bool acc) {
    for (int g = 0; g < 32; g += 8) {
        const uint32_t *a = Ap + g * kp;            /* row g + r's pair p: a[r * kp + p] */
        float *c = C + g * ldc;
        __m512 c0[8], c1[8];
        for (int r = 0; r < 8; r++) {
            c0[r] = acc ? _mm512_loadu_ps(c + r * ldc) : _mm512_setzero_ps();
            c1[r] = acc ? _mm512_loadu_ps(c + r * ldc + 16) : _mm512_setzero_ps();
        }
        for (int64_t p = 0; p < kp; p++) {
            const __m512bh b0 = (__m512bh)_mm512_loadu_si512(Bp + p * 32);
            const __m512bh b1 = (__m512bh)_mm512_loadu_si512(Bp + p * 32 + 16);
#pragma GCC unroll 8
            for (int r = 0; r < 8; r++) {
                const __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[r * kp + p]);
                c0[r] = _mm512_dpbf16_ps(c0[r], av, b0);
                c1[r] = _mm512_dpbf16_ps(c1[r], av, b1);
            }
        }
        for (int r = 0; r < 8; r++) {
            _mm512_storeu_ps(c + r * ldc, c0[r]);
            _mm512_storeu_ps(c + r * ldc + 16, c1[r]);
        }
    }
}
