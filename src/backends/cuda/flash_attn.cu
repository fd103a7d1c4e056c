/* flash_attn.cu: FlashAttention-2 style sdpa on the tensor cores for 16-bit
 * operands: the forward (KN_OP_SDPA) and the fused gradient (KN_OP_SDPA_BWD).
 *
 * Shapes (graph/ops_nn.c states the arithmetic): q [B,Hq,Tq,D], k [B,Hkv,Tk,D],
 * v [B,Hkv,Tk,D], query head h reads key/value head h / G (G = Hq / Hkv);
 * causal: key j is visible to query i iff j <= i + (Tk - Tq). A query row
 * with no visible key gives a NaN output row and a NaN dq row.
 *
 * What fits: q, k, v (and g = dL/dy) all bf16 or all f16, D == Dv in {64, 128},
 * unit stride along D, every other stride a multiple of 8 elements and the
 * data 16-byte aligned (the head views of a fused [B,T,3C] projection fit:
 * row stride 3C). y (or the packed dq|dk|dv) is the operand dtype or f32.
 * A sliding window or a softcap (kn_sdpa_ex) is not handled here yet.
 * Anything else returns KN_ERR_UNSUPPORTED without a message and the caller
 * takes its older path. Portable sm_80 code (mma.sync m16n8k16, ldmatrix,
 * cp.async), which other GPUs run; on an sm_90a GPU the forward is
 * flash_sm90.cu's wgmma/TMA kernel where it applies (KN_CUDA_TUNE=flash_sm90).
 *
 * Forward, a block of 4 warps per 64 query rows of one (b, h) (D = 64 has
 * variants, see fa_fwd_dispatch): Q stays in
 * registers (A fragments), K/V tiles of 64 keys stream through shared memory
 * (cp.async, two buffers), S = Q K^T and O += P V on the tensor cores with
 * f32 accumulators, online softmax in f32 in the log2 domain (scores are
 * pre-multiplied by scale * log2(e), so exp2 is one instruction).
 *
 * Backward (FlashAttention-2, Dao 2023, algorithm 2):
 *   1. per query row the log2 sum-exp L_i and D_i = dO_i . y_i from the
 *      forward's y (SDPA_BWD's fifth source). Where the sdpa node keeps L
 *      (p.sdpa.lse: the graph sets it when q, k, v need gradients; the plan
 *      gives it a block, kn_exec.aux in the forward and src_aux[4] here) the
 *      forward wrote it, and a small kernel computes D_i; otherwise a
 *      pre-pass = the forward kernel's S = Q K^T and online max/sum only
 *      (no V, no P V) computes both;
 *   2. a block per 64-key tile of one (b, kv head) loops over the group's
 *      query heads and the query tiles that can see the keys:
 *        S^T = K Q^T, P^T = exp2(S^T scale log2e - L), dP^T = V dO^T,
 *        dS^T = scale P^T (dP^T - D), dV += P^T dO, dK += dS^T Q
 *      (dK, dV in f32 registers, 16 keys a warp, summed over the group),
 *      and dQ += dS K through shared memory into an f32 scratch with atomics;
 *   3. dQ scratch -> the output dtype (NaN rows where L = -inf).
 * P and dS are rounded to the operand dtype before their MMAs, as in the
 * paper's kernels; everything else accumulates in f32.
 */
#include "backends/cuda/cuda_ops.cuh"
#include "backends/cuda/flash.cuh"       // defines: fa_fwd_args, fa_exp2, fa_lse, fa_store, fa_block, fa_store_rows
#include "backends/cuda/kn_cuda.h"
#include "backends/cuda/tune.cuh"     // defines: kn_cuda_tune (KN_CUDA_TUNE=flash_mt=2,flash_minb=1)

/* ---- PTX wrappers --------------------------------------------------------------- */
__device__ __forceinline__ uint32_t fa_smem(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
/* 16 bytes global -> shared; ok false writes 16 zero bytes (reads nothing) */
__device__ __forceinline__ void fa_cp16(void *dst, const void *src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(fa_smem(dst)), "l"(src), "r"(ok ? 16 : 0));
}
/* 4 bytes global -> shared (ok false: a zero) */
__device__ __forceinline__ void fa_cp4(void *dst, const void *src, bool ok) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(fa_smem(dst)), "l"(src), "r"(ok ? 4 : 0));
}
__device__ __forceinline__ void fa_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void fa_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
/* four 8x8 16-bit matrices; lane l gives the row address of matrix l/8 */
__device__ __forceinline__ void fa_ldsm(uint32_t r[4], const uint16_t *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(fa_smem(p)));
}
__device__ __forceinline__ void fa_ldsm_t(uint32_t r[4], const uint16_t *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(fa_smem(p)));
}
/* c[16x8] += a[16x16] b[16x8], f32 accumulators. Fragments (g = lane/4, t = lane%4):
 * a0 (g, 2t..2t+1) a1 (g+8, 2t..) a2 (g, 2t+8..) a3 (g+8, 2t+8..);
 * b0 (k 2t..2t+1, n g) b1 (k 2t+8.., n g); c0,c1 (g, 2t..2t+1) c2,c3 (g+8, 2t..). */
template <bool BF>
__device__ __forceinline__ void fa_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    if (BF)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* a 16-bit value (bf16 or f16) as f32 */
template <bool BF> __device__ __forceinline__ float fa_to_f(uint16_t h) { return BF ? kn_bf2f(h) : kn_dev_h2f(h); }
/* dst[0..1] += (x, y) in global memory (8-byte aligned); one vector atomic on sm_90 */
__device__ __forceinline__ void fa_atomic2(float *dst, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd((float2 *)dst, make_float2(x, y));
#else
    atomicAdd(dst, x);
    atomicAdd(dst + 1, y);
#endif
}


/* R rows x D columns of 16-bit data (row stride ld elements, rows >= n are
 * zero-filled) into shared memory with row pitch D + 8: the 16-byte pad puts
 * the 8 rows of an ldmatrix in 8 different bank groups. */
template <int R, int D>
__device__ __forceinline__ void fa_load_tile(uint16_t *s, const uint16_t *g, int64_t ld, int n, const uint16_t *any) {
    constexpr int CPR = D / 8, P = D + 8, RPP = 128 / CPR;    /* rows one pass of the 128 threads covers */
    static_assert(R % RPP == 0, "whole passes");
    const int r0 = threadIdx.x / CPR, col = (threadIdx.x % CPR) * 8;
    const uint16_t *gp = g + r0 * ld + col;
    uint16_t *sp = s + r0 * P + col;
    /* a fixed trip count (the loop over c = threadIdx.x + 128 i was a
     * counted loop with a division a chunk: ~400 instructions for the
     * backward's two tiles an iteration) */
#pragma unroll
    for (int i = 0; i < R / RPP; i++) {
        const bool ok = r0 + i * RPP < n;
        fa_cp16(sp + i * RPP * P, ok ? gp + i * RPP * ld : any, ok);
    }
}

/* ---- forward (and the backward's pre-pass) --------------------------------------- */

/* grid (query tiles, Hq, B), 128 threads; the longest causal tiles first
 * (fa_block).
 * Warp w owns query rows 16 MT w .. 16 MT (w + 1) - 1 of the BR = 64 MT row
 * tile: each K/V fragment read from shared memory feeds MT MMAs (MT = 2
 * halves the ldmatrix traffic per MMA, at the price of registers). */
template <int D, int MT, int MINB, bool BF, bool PRE>
__global__ void __launch_bounds__(128, MINB) k_flash_fwd(fa_fwd_args a) {
    constexpr int P = D + 8, BR = 64 * MT, BC = 64;
    extern __shared__ __align__(16) uint16_t fa_sm[];
    uint16_t *Qs = fa_sm, *Ks = Qs + BR * P, *Vs = Ks + 2 * BC * P;     /* Q [BR][P], K, V [2][64][P] */
    int tile, h, b;
    fa_block(tile, h, b);
    tile = gridDim.x - 1 - tile;
    const int hk = h / a.G;
    const int i0 = tile * BR, w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int off = a.Tk - a.Tq;
    const uint16_t *qb = a.q + b * a.qs[0] + h * a.qs[1];
    const uint16_t *kb = a.k + b * a.ks[0] + hk * a.ks[1], *vb = a.v + b * a.vs[0] + hk * a.vs[1];
    int kend = a.Tk;                                     /* keys [0, kend) can be visible to this tile */
    if (a.causal) kend = min(a.Tk, min(i0 + BR, a.Tq) + off);
    const int nkt = kend > 0 ? (kend + BC - 1) / BC : 0;
    fa_load_tile<BR, D>(Qs, qb + i0 * a.qs[2], a.qs[2], a.Tq - i0, a.q);
    if (nkt > 0) {
        fa_load_tile<BC, D>(Ks, kb, a.ks[2], a.Tk, a.k);
        if (!PRE) fa_load_tile<BC, D>(Vs, vb, a.vs[2], a.Tk, a.v);
    }
    fa_commit();
    float o[MT][D / 8][4], m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.f;
#pragma unroll
        for (int n = 0; n < D / 8; n++) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
    }
    uint32_t qf[MT][D / 16][4];
    const int r0 = i0 + w * 16 * MT + g;                 /* row of (mt, half e/2): r0 + 16 mt + 8 (e/2) */
    for (int kt = 0; kt < nkt; kt++) {
        if (kt + 1 < nkt) {
            int j1 = (kt + 1) * BC, buf = (kt + 1) & 1;
            fa_load_tile<BC, D>(Ks + buf * BC * P, kb + j1 * a.ks[2], a.ks[2], a.Tk - j1, a.k);
            if (!PRE) fa_load_tile<BC, D>(Vs + buf * BC * P, vb + j1 * a.vs[2], a.vs[2], a.Tk - j1, a.v);
            fa_commit();
            fa_wait<1>();
        } else {
            fa_wait<0>();
        }
        __syncthreads();
        if (kt == 0) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int kk = 0; kk < D / 16; kk++)
                    fa_ldsm(qf[mt][kk], Qs + (w * 16 * MT + mt * 16 + (lane & 15)) * P + kk * 16 + (lane >> 4) * 8);
        }
        const uint16_t *K = Ks + (kt & 1) * BC * P, *V = Vs + (kt & 1) * BC * P;
        float s[MT][BC / 8][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int n = 0; n < BC / 8; n++) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
#pragma unroll
            for (int n2 = 0; n2 < BC / 16; n2++) {
                uint32_t r[4];
                fa_ldsm(r, K + (n2 * 16 + (lane & 7) + ((lane >> 4) << 3)) * P + kk * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    fa_mma<BF>(s[mt][2 * n2], qf[mt][kk], r[0], r[1]);
                    fa_mma<BF>(s[mt][2 * n2 + 1], qf[mt][kk], r[2], r[3]);
                }
            }
        }
        const int j0 = kt * BC;
        const bool edge = j0 + BC > a.Tk || (a.causal && j0 + BC - 1 > i0 + off);
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            float mx[2] = {m[mt][0], m[mt][1]};
#pragma unroll
            for (int n = 0; n < BC / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float x = s[mt][n][e] * a.sl2;
                    if (edge) {
                        int j = j0 + n * 8 + 2 * t + (e & 1), r = r0 + mt * 16 + (e >> 1) * 8;
                        if (j >= a.Tk || (a.causal && j > r + off)) x = -INFINITY;
                    }
                    s[mt][n][e] = x;
                    mx[e >> 1] = fmaxf(mx[e >> 1], x);
                }
            float al[2], ms[2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
                ms[r] = mx[r] == -INFINITY ? 0.f : mx[r];    /* a row with nothing visible yet: exp2(-inf) = 0 */
                al[r] = fa_exp2(m[mt][r] - ms[r]);
                m[mt][r] = mx[r];
                l[mt][r] *= al[r];
            }
#pragma unroll
            for (int n = 0; n < D / 8; n++) {
                o[mt][n][0] *= al[0]; o[mt][n][1] *= al[0]; o[mt][n][2] *= al[1]; o[mt][n][3] *= al[1];
            }
#pragma unroll
            for (int n = 0; n < BC / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) { float p = fa_exp2(s[mt][n][e] - ms[e >> 1]); s[mt][n][e] = p; l[mt][e >> 1] += p; }
        }
        /* O += P V: P's accumulators are already A fragments (keys 16kc.. = n-blocks 2kc, 2kc+1);
         * the pre-pass needs only m and l */
#pragma unroll
        for (int kc = 0; kc < (PRE ? 0 : BC / 16); kc++) {
            uint32_t pa[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                pa[mt][0] = kn_pack16<BF>(s[mt][2 * kc][0], s[mt][2 * kc][1]);
                pa[mt][1] = kn_pack16<BF>(s[mt][2 * kc][2], s[mt][2 * kc][3]);
                pa[mt][2] = kn_pack16<BF>(s[mt][2 * kc + 1][0], s[mt][2 * kc + 1][1]);
                pa[mt][3] = kn_pack16<BF>(s[mt][2 * kc + 1][2], s[mt][2 * kc + 1][3]);
            }
#pragma unroll
            for (int n2 = 0; n2 < D / 16; n2++) {
                uint32_t r[4];
                fa_ldsm_t(r, V + (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * P + n2 * 16 + (lane >> 4) * 8);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    fa_mma<BF>(o[mt][2 * n2], pa[mt], r[0], r[1]);
                    fa_mma<BF>(o[mt][2 * n2 + 1], pa[mt], r[2], r[3]);
                }
            }
        }
        __syncthreads();                                 /* the next iteration refills the other buffer */
    }
    fa_wait<0>();
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        float inv[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            l[mt][r] += __shfl_xor_sync(0xffffffffu, l[mt][r], 1);
            l[mt][r] += __shfl_xor_sync(0xffffffffu, l[mt][r], 2);
            inv[r] = 1.f / l[mt][r];
        }
        const int ra = r0 + mt * 16, rb = ra + 8;
        if (!PRE) {
#pragma unroll
            for (int n = 0; n < D / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++)               /* no visible key: a NaN row */
                    o[mt][n][e] = l[mt][e >> 1] > 0.f ? o[mt][n][e] * inv[e >> 1] : __int_as_float(0x7fc00000);
            if (a.ypair) {                               /* unit column stride: pairs of columns */
                const size_t es = a.ydt == KN_F32 ? 4 : 2;
                char *yb = (char *)a.y + (b * a.ys[0] + h * a.ys[1]) * es;
                fa_store_rows<D / 8, BF>(ra < a.Tq ? yb + ra * a.ys[2] * es : NULL, rb < a.Tq ? yb + rb * a.ys[2] * es : NULL,
                                         a.ydt, o[mt], t);
            } else {
#pragma unroll
                for (int n = 0; n < D / 8; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int r = e >> 1 ? rb : ra, c = n * 8 + 2 * t + (e & 1);
                        if (r < a.Tq) fa_store(a.y, a.ydt, b * a.ys[0] + h * a.ys[1] + r * a.ys[2] + c * a.ys[3], o[mt][n][e]);
                    }
            }
            if (a.lse && t == 0) {                       /* kept for the gradient (kn__aux_bytes): as the pre-pass writes it */
                const int64_t base = ((int64_t)b * a.Hq + h) * a.Tq;
                if (ra < a.Tq) a.lse[base + ra] = fa_lse(m[mt][0], l[mt][0]);
                if (rb < a.Tq) a.lse[base + rb] = fa_lse(m[mt][1], l[mt][1]);
            }
        } else {
            /* D_i = dO_i . y_i over the quad's columns (y as the forward stored
             * it, as in FlashAttention-2), then L_i = m + log2(l) */
            float dsum[2] = {0.f, 0.f};
            const uint16_t *gb = a.g + b * a.gs[0] + h * a.gs[1], *yb = a.yin + b * a.yis[0] + h * a.yis[1];
#pragma unroll
            for (int n = 0; n < D / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int r = e >> 1 ? rb : ra, c = n * 8 + 2 * t + (e & 1);
                    if (r < a.Tq) {
                        uint16_t gv = gb[r * a.gs[2] + c], yv = yb[r * a.yis[2] + c * a.yis[3]];
                        float gf = fa_to_f<BF>(gv), yf = fa_to_f<BF>(yv);
                        dsum[e >> 1] += gf * yf;
                    }
                }
#pragma unroll
            for (int r = 0; r < 2; r++) {
                dsum[r] += __shfl_xor_sync(0xffffffffu, dsum[r], 1);
                dsum[r] += __shfl_xor_sync(0xffffffffu, dsum[r], 2);
            }
            if (t == 0) {
                int64_t base = ((int64_t)b * a.Hq + h) * a.Tq;
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    int row = r ? rb : ra;
                    if (row < a.Tq) {
                        a.lse[base + row] = fa_lse(m[mt][r], l[mt][r]);
                        a.dd[base + row] = l[mt][r] > 0.f ? dsum[r] : 0.f;
                    }
                }
            }
        }
    }
}

/* ---- backward: a block per 64-key tile ------------------------------------------- */
struct fa_bwd_args {
    const uint16_t *q, *k, *v, *g;    /* element strides [b, h, t]; unit along D */
    int64_t qs[3], ks[3], vs[3], gs[3];
    const float *lse, *dd;            /* [B*Hq*Tq] from the pre-pass */
    float *dq;                        /* f32 scratch [B,Hq,Tq,D], zeroed */
    void *dk, *dv;                    /* [B,Hkv,Tk,D] contiguous, in odt */
    int odt;
    int Hq, Hkv, G, Tq, Tk, causal;
    float sl2, scale;
};

/* grid (key tiles, Hkv, B), 128 threads: warp w owns keys 16w..16w+15 of the
 * tile for S^T, dP^T, dK, dV; for dQ = dS K the warps split the BR x D tile
 * into (BR/16) row groups x 64 columns. BR = 64 query rows (D = 64) or 32
 * (D = 128, to keep the f32 accumulators in registers). */
template <int D, bool BF>
__global__ void __launch_bounds__(128) k_flash_bwd(fa_bwd_args a) {
    constexpr int P = D + 8, BC = 64, BR = D == 128 ? 32 : 64, PS = BR + 8;
    extern __shared__ __align__(16) uint16_t fa_sm[];
    uint16_t *Ks = fa_sm, *Vs = Ks + BC * P, *Qs = Vs + BC * P, *Gs = Qs + 2 * BR * P, *Ss = Gs + 2 * BR * P;
    float *Ls = (float *)(Ss + 64 * PS), *Ds = Ls + 2 * BR;
    /* K, V [64][P]; Q, dO [2][BR][P]; dS^T [64 keys][BR + 8]; L, D of the query tile [2][BR] each */
    int kt, hk, b;
    fa_block(kt, hk, b);                                 /* key tile 0 first: under a causal mask the most queries see it */
    const int j0 = kt * BC;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int off = a.Tk - a.Tq;
    const uint16_t *kb = a.k + b * a.ks[0] + hk * a.ks[1] + j0 * a.ks[2];
    const uint16_t *vb = a.v + b * a.vs[0] + hk * a.vs[1] + j0 * a.vs[2];
    int qt0 = 0;                                         /* the first query tile that sees a key of this tile */
    if (a.causal) qt0 = max(0, j0 - off) / BR;
    const int nqt = (a.Tq + BR - 1) / BR, per = nqt > qt0 ? nqt - qt0 : 0, nit = per * a.G;
    fa_load_tile<BC, D>(Ks, kb, a.ks[2], a.Tk - j0, a.k);
    fa_load_tile<BC, D>(Vs, vb, a.vs[2], a.Tk - j0, a.v);
    int lh = 0, lq = qt0;                               /* (head in the group, query tile) of the next load */
    auto load_q = [&](int buf) {
        const int h = hk * a.G + lh, i0 = lq * BR;
        if (++lq == nqt) { lq = qt0; lh++; }
        fa_load_tile<BR, D>(Qs + buf * BR * P, a.q + b * a.qs[0] + h * a.qs[1] + i0 * a.qs[2], a.qs[2], a.Tq - i0, a.q);
        fa_load_tile<BR, D>(Gs + buf * BR * P, a.g + b * a.gs[0] + h * a.gs[1] + i0 * a.gs[2], a.gs[2], a.Tq - i0, a.g);
        /* the tile's L and D (rows past Tq read as 0: the mask below zeroes their P) */
        const int64_t rowb = ((int64_t)b * a.Hq + h) * a.Tq + i0;
        static_assert(2 * BR <= 128, "one value a thread");
        if (threadIdx.x < 2 * BR) {
            const int r = threadIdx.x, rr = r % BR;
            const bool ok = i0 + rr < a.Tq;
            const float *src = r < BR ? a.lse : a.dd;
            fa_cp4((r < BR ? Ls : Ds) + buf * BR + rr, ok ? src + rowb + rr : src, ok);
        }
    };
    if (nit > 0) load_q(0);
    fa_commit();
    float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[n][e] = dv[n][e] = 0.f;
    const int rka = j0 + w * 16 + g, rkb = rka + 8;      /* this thread's two keys */
    for (int it = 0, ch = 0, cq = qt0; it < nit; it++) {
        const int h = hk * a.G + ch, i0 = cq * BR, buf = it & 1;
        if (++cq == nqt) { cq = qt0; ch++; }
        if (it + 1 < nit) {
            load_q(buf ^ 1);
            fa_commit();
            fa_wait<1>();
        } else {
            fa_wait<0>();
        }
        /* the tile's L and D came with Q and dO (cp.async); they are read
         * from shared memory only after the MMAs below, they would hold
         * 2 BR / 4 registers a thread across them */
        const int64_t rowb = ((int64_t)b * a.Hq + h) * a.Tq;
        __syncthreads();
        const uint16_t *Q = Qs + buf * BR * P, *G = Gs + buf * BR * P;
        float s[BR / 8][4], dp[BR / 8][4];
#pragma unroll
        for (int n = 0; n < BR / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[n][e] = dp[n][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            uint32_t ka[4], va[4];
            fa_ldsm(ka, Ks + (w * 16 + (lane & 15)) * P + kk * 16 + (lane >> 4) * 8);
            fa_ldsm(va, Vs + (w * 16 + (lane & 15)) * P + kk * 16 + (lane >> 4) * 8);
#pragma unroll
            for (int n2 = 0; n2 < BR / 16; n2++) {
                uint32_t r[4];
                fa_ldsm(r, Q + (n2 * 16 + (lane & 7) + ((lane >> 4) << 3)) * P + kk * 16 + ((lane >> 3) & 1) * 8);
                fa_mma<BF>(s[2 * n2], ka, r[0], r[1]);
                fa_mma<BF>(s[2 * n2 + 1], ka, r[2], r[3]);
                fa_ldsm(r, G + (n2 * 16 + (lane & 7) + ((lane >> 4) << 3)) * P + kk * 16 + ((lane >> 3) & 1) * 8);
                fa_mma<BF>(dp[2 * n2], va, r[0], r[1]);
                fa_mma<BF>(dp[2 * n2 + 1], va, r[2], r[3]);
            }
        }
        /* P^T and dS^T in place (s, dp); masked entries are exactly 0 */
        const bool edge = j0 + BC > a.Tk || i0 + BR > a.Tq || (a.causal && j0 + BC - 1 > i0 + off);
#pragma unroll
        for (int n = 0; n < BR / 8; n++) {
            const float2 L = *(const float2 *)(Ls + buf * BR + n * 8 + 2 * t), Dd = *(const float2 *)(Ds + buf * BR + n * 8 + 2 * t);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int c = i0 + n * 8 + 2 * t + (e & 1), rk = e >> 1 ? rkb : rka;
                bool ok = !edge || (rk < a.Tk && c < a.Tq && (!a.causal || rk <= c + off));
                float p = ok ? fa_exp2(s[n][e] * a.sl2 - (e & 1 ? L.y : L.x)) : 0.f;
                s[n][e] = p;
                dp[n][e] = ok ? a.scale * p * (dp[n][e] - (e & 1 ? Dd.y : Dd.x)) : 0.f;
            }
        }
        /* dV += P^T dO, dK += dS^T Q: the accumulators are A fragments (queries 16kc..) */
#pragma unroll
        for (int kc = 0; kc < BR / 16; kc++) {
            uint32_t pa[4] = {kn_pack16<BF>(s[2 * kc][0], s[2 * kc][1]), kn_pack16<BF>(s[2 * kc][2], s[2 * kc][3]),
                              kn_pack16<BF>(s[2 * kc + 1][0], s[2 * kc + 1][1]), kn_pack16<BF>(s[2 * kc + 1][2], s[2 * kc + 1][3])};
            uint32_t da[4] = {kn_pack16<BF>(dp[2 * kc][0], dp[2 * kc][1]), kn_pack16<BF>(dp[2 * kc][2], dp[2 * kc][3]),
                              kn_pack16<BF>(dp[2 * kc + 1][0], dp[2 * kc + 1][1]), kn_pack16<BF>(dp[2 * kc + 1][2], dp[2 * kc + 1][3])};
            /* dS^T to shared memory for dQ (rows: keys, columns: queries) */
            *(uint32_t *)(Ss + (w * 16 + g) * PS + kc * 16 + 2 * t) = da[0];
            *(uint32_t *)(Ss + (w * 16 + g + 8) * PS + kc * 16 + 2 * t) = da[1];
            *(uint32_t *)(Ss + (w * 16 + g) * PS + kc * 16 + 8 + 2 * t) = da[2];
            *(uint32_t *)(Ss + (w * 16 + g + 8) * PS + kc * 16 + 8 + 2 * t) = da[3];
#pragma unroll
            for (int n2 = 0; n2 < D / 16; n2++) {
                uint32_t r[4];
                fa_ldsm_t(r, G + (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * P + n2 * 16 + (lane >> 4) * 8);
                fa_mma<BF>(dv[2 * n2], pa, r[0], r[1]);
                fa_mma<BF>(dv[2 * n2 + 1], pa, r[2], r[3]);
                fa_ldsm_t(r, Q + (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * P + n2 * 16 + (lane >> 4) * 8);
                fa_mma<BF>(dk[2 * n2], da, r[0], r[1]);
                fa_mma<BF>(dk[2 * n2 + 1], da, r[2], r[3]);
            }
        }
        __syncthreads();
        /* dQ[BR x D] += dS K: warp w takes query rows 16 (w % (BR/16)).. and columns 64 (w / (BR/16)).. */
        {
            constexpr int NRG = BR / 16;
            const int qr0 = (w % NRG) * 16, d0 = (w / NRG) * 64;
            float acc[8][4];
#pragma unroll
            for (int n = 0; n < 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
#pragma unroll
            for (int kc = 0; kc < BC / 16; kc++) {
                uint32_t sa[4];
                fa_ldsm_t(sa, Ss + (kc * 16 + (lane & 7) + (lane >> 4) * 8) * PS + qr0 + ((lane >> 3) & 1) * 8);
#pragma unroll
                for (int n2 = 0; n2 < 4; n2++) {
                    uint32_t r[4];
                    fa_ldsm_t(r, Ks + (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * P + d0 + n2 * 16 + (lane >> 4) * 8);
                    fa_mma<BF>(acc[2 * n2], sa, r[0], r[1]);
                    fa_mma<BF>(acc[2 * n2 + 1], sa, r[2], r[3]);
                }
            }
            const int qa = qr0 + g;
            float *pa = a.dq + (rowb + i0 + qa) * D + d0 + 2 * t, *pb = pa + 8 * D;   /* rows qa, qa + 8 */
            if (i0 + BR <= a.Tq) {                       /* a whole tile: no row checks, constant offsets */
#pragma unroll
                for (int n = 0; n < 8; n++) {
                    fa_atomic2(pa + n * 8, acc[n][0], acc[n][1]);
                    fa_atomic2(pb + n * 8, acc[n][2], acc[n][3]);
                }
            } else {
                const bool oka = i0 + qa < a.Tq, okb = i0 + qa + 8 < a.Tq;
#pragma unroll
                for (int n = 0; n < 8; n++) {
                    if (oka) fa_atomic2(pa + n * 8, acc[n][0], acc[n][1]);
                    if (okb) fa_atomic2(pb + n * 8, acc[n][2], acc[n][3]);
                }
            }
        }
        __syncthreads();                                 /* Ss and this Q/dO buffer are reused */
    }
    fa_wait<0>();
    /* dK, dV rows of this tile (zero where no query sees the key) */
    const int64_t ob = ((int64_t)b * a.Hkv + hk) * a.Tk;
    const size_t es = a.odt == KN_F32 ? 4 : 2;
    char *ka = (char *)a.dk + (ob + rka) * D * es, *va = (char *)a.dv + (ob + rka) * D * es;
    fa_store_rows<D / 8, BF>(rka < a.Tk ? ka : NULL, rkb < a.Tk ? ka + 8 * D * es : NULL, a.odt, dk, t);
    fa_store_rows<D / 8, BF>(rka < a.Tk ? va : NULL, rkb < a.Tk ? va + 8 * D * es : NULL, a.odt, dv, t);
}

/* dq (odt, contiguous) from the f32 scratch, 4 elements a thread (D is 64
 * or 128); rows with no visible key are NaN */
__global__ void k_flash_dq(void *dq, int odt, const float *acc, const float *lse, int64_t n, int D) {
    KN_GRID_LOOP(i, n / 4) {
        float4 x = ((const float4 *)acc)[i];
        if (lse[i * 4 / D] == -INFINITY) x.x = x.y = x.z = x.w = __int_as_float(0x7fc00000);
        if (odt == KN_F32) {
            ((float4 *)dq)[i] = x;
        } else if (odt == KN_BF16) {
            ((uint2 *)dq)[i] = make_uint2(kn_f2bf(x.x) | (uint32_t)kn_f2bf(x.y) << 16, kn_f2bf(x.z) | (uint32_t)kn_f2bf(x.w) << 16);
        } else {
            ((uint2 *)dq)[i] = make_uint2(kn_dev_f2h(x.x) | (uint32_t)kn_dev_f2h(x.y) << 16,
                                          kn_dev_f2h(x.z) | (uint32_t)kn_dev_f2h(x.w) << 16);
        }
    }
}

/* D_i = dO_i . y_i per query row, where the forward kept L_i (the pre-pass
 * is then not run): 8 lanes a row, 8 columns (16 bytes) a lane per step */
template <bool BF>
__global__ void k_flash_dd(float *dd, const uint16_t *g, const uint16_t *y, int64_t gs0, int64_t gs1, int64_t gs2,
                           int64_t ys0, int64_t ys1, int64_t ys2, int Hq, int Tq, int D, int64_t rows) {
    const int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 8;
    const int l8 = threadIdx.x & 7;
    float s = 0.f;
    if (r < rows) {
        const int64_t bh = r / Tq, i = r % Tq, b = bh / Hq, h = bh % Hq;
        const uint16_t *gr = g + b * gs0 + h * gs1 + i * gs2, *yr = y + b * ys0 + h * ys1 + i * ys2;
        for (int c = l8 * 8; c < D; c += 64) {
            const uint4 gv = *(const uint4 *)(gr + c), yv = *(const uint4 *)(yr + c);
            const uint32_t gw[4] = {gv.x, gv.y, gv.z, gv.w}, yw[4] = {yv.x, yv.y, yv.z, yv.w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                uint16_t g0 = (uint16_t)(gw[j] & 0xffff), g1 = (uint16_t)(gw[j] >> 16);
                uint16_t y0 = (uint16_t)(yw[j] & 0xffff), y1 = (uint16_t)(yw[j] >> 16);
                s += fa_to_f<BF>(g0) * fa_to_f<BF>(y0);
                s += fa_to_f<BF>(g1) * fa_to_f<BF>(y1);
            }
        }
    }
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    s += __shfl_xor_sync(0xffffffffu, s, 2);
    s += __shfl_xor_sync(0xffffffffu, s, 4);
    if (r < rows && l8 == 0) dd[r] = s;
}

/* ---- host side -------------------------------------------------------------------- */
/* launches so far: forward, backward, backward runs that read the
 * forward's kept log-sum-exp, and forwards on flash_sm90.cu's wgmma kernel;
 * tests check that a case took this path (a fallback would give right
 * answers too) */
static uint64_t fa_runs[4];
extern "C" uint64_t kn_cu_flash_runs(int which) { return fa_runs[which < 0 ? 0 : which > 3 ? 3 : which]; }

/* a 16-bit [B,H,T,D] operand the tiles can read with 16-byte copies */
static bool fa_view_ok(const kn_tview *v, kn_dtype dt, int64_t D) {
    if (v->dtype != dt || v->ndim != 4 || v->ne[3] != D || v->st[3] != 1 || !kn_aligned16(v->data)) return false;
    for (int d = 0; d < 3; d++)
        if (v->ne[d] > 1 && (v->st[d] % 8 || v->st[d] < 0)) return false;
    return true;
}
static void fa_strides(const kn_tview *v, int64_t s[3]) {
    for (int d = 0; d < 3; d++) s[d] = v->ne[d] > 1 ? v->st[d] : 0;
}
/* the common conditions of both directions; *bf: bf16 (else f16) */
static bool fa_fits(const kn_exec *e, bool *bf) {
    if (e->node->p.sdpa.window > 0 || e->node->p.sdpa.softcap > 0) return false;   /* kn_sdpa_ex: the other paths */
    const kn_tview *q = &e->src[0], *k = &e->src[1], *v = &e->src[2];
    kn_dtype dt = q->dtype;
    int64_t D = q->ndim == 4 ? q->ne[3] : 0;
    if ((dt != KN_BF16 && dt != KN_F16) || (D != 64 && D != 128) || kn_env_get()->cuda_generic) return false;
    if (!fa_view_ok(q, dt, D) || !fa_view_ok(k, dt, D) || !fa_view_ok(v, dt, D)) return false;
    int64_t B = q->ne[0], Hq = q->ne[1], Tq = q->ne[2], Hkv = k->ne[1], Tk = k->ne[2];
    if (Hkv < 1 || Hq % Hkv || Tk < 1 || Tq < 1 || B > 65535 || Hq > 65535 || Tq > (1 << 30) || Tk > (1 << 30)) return false;
    *bf = dt == KN_BF16;
    return true;
}
static size_t fa_fwd_smem(int D, int MT) { return sizeof(uint16_t) * (size_t)((64 * MT + 4 * 64) * (D + 8)); }
static size_t fa_bwd_smem(int D) {
    int BR = D == 128 ? 32 : 64;
    return sizeof(uint16_t) * (size_t)(2 * 64 * (D + 8) + 4 * BR * (D + 8) + 64 * (BR + 8)) + sizeof(float) * 4 * BR;
}
template <int D, int MT, int MINB, bool BF, bool PRE> static kn_status fa_launch_fwd(const fa_fwd_args &a, int B) {
    size_t smem = fa_fwd_smem(D, MT);
    static bool attr = false;              /* once per instantiation (the opt-in above 48 KiB) */
    if (!attr) { kn_status st = fa_smem_attr(k_flash_fwd<D, MT, MINB, BF, PRE>, smem); if (st) return st; attr = true; }
    dim3 grid((unsigned)((a.Tq + 64 * MT - 1) / (64 * MT)), (unsigned)a.Hq, (unsigned)B);
    k_flash_fwd<D, MT, MINB, BF, PRE><<<grid, 128, smem, kn_cu_stream()>>>(a);
    KN_CUDA_LAUNCHED();
    return KN_OK;
}
/* Variants for D = 64 (KN_CUDA_TUNE keys, read once): flash_mt=2 gives a
 * warp two row tiles (half the ldmatrix traffic per MMA, but 243 registers:
 * 2 blocks an SM); flash_minb=4 caps the registers at 128 so that 4 blocks
 * (16 warps) share an SM, flash_minb=1 lets ptxas take 139 (3 blocks).
 * D = 128 has one variant (178 registers and 87 KiB of shared memory: 2
 * blocks an SM; two row tiles would not fit the registers). */
template <bool PRE> static kn_status fa_fwd_dispatch(const fa_fwd_args &a, int D, bool bf, int B) {
    static int mt = 0, minb = 0;
    if (!mt) {
        mt = kn_cuda_tune("flash_mt", 1) == 2 ? 2 : 1;
        minb = kn_cuda_tune("flash_minb", 4) == 1 ? 1 : 4;
    }
    if (D == 64 && mt == 2) return bf ? fa_launch_fwd<64, 2, 1, true, PRE>(a, B) : fa_launch_fwd<64, 2, 1, false, PRE>(a, B);
    if (D == 64 && minb == 4) return bf ? fa_launch_fwd<64, 1, 4, true, PRE>(a, B) : fa_launch_fwd<64, 1, 4, false, PRE>(a, B);
    if (D == 64) return bf ? fa_launch_fwd<64, 1, 1, true, PRE>(a, B) : fa_launch_fwd<64, 1, 1, false, PRE>(a, B);
    return bf ? fa_launch_fwd<128, 1, 1, true, PRE>(a, B) : fa_launch_fwd<128, 1, 1, false, PRE>(a, B);
}
static fa_fwd_args fa_fwd_from(const kn_exec *e) {
    const kn_tview *q = &e->src[0], *k = &e->src[1], *v = &e->src[2];
    fa_fwd_args a;
    memset(&a, 0, sizeof a);
    a.q = (const uint16_t *)q->data; a.k = (const uint16_t *)k->data; a.v = (const uint16_t *)v->data;
    fa_strides(q, a.qs); fa_strides(k, a.ks); fa_strides(v, a.vs);
    a.Hq = (int)q->ne[1]; a.G = (int)(q->ne[1] / k->ne[1]); a.Tq = (int)q->ne[2]; a.Tk = (int)k->ne[2];
    a.causal = e->node->p.sdpa.causal;
    a.sl2 = (float)(e->node->p.sdpa.scale * 1.4426950408889634);
    return a;
}

/* KN_OP_SDPA; KN_ERR_UNSUPPORTED (no message) when it does not fit */
kn_status kn_cu_flash_fwd(const kn_exec *e) {
    const kn_tview *q = &e->src[0], *y = &e->dst;
    bool bf;
    if (!fa_fits(e, &bf) || (y->dtype != q->dtype && y->dtype != KN_F32) || y->ndim != 4) return KN_ERR_UNSUPPORTED;
    fa_fwd_args a = fa_fwd_from(e);
    a.y = y->data;
    for (int d = 0; d < 4; d++) a.ys[d] = y->st[d];
    a.ydt = (int)y->dtype;
    a.ypair = y->st[3] == 1 && y->st[0] % 2 == 0 && y->st[1] % 2 == 0 && y->st[2] % 2 == 0 && kn_aligned16(y->data);
    /* the node keeps each row's log-sum-exp for the gradient (kn__aux_bytes;
     * the plan's room for it: e->aux) */
    if (e->aux) a.lse = (float *)e->aux;
    /* Hopper's wgmma kernel first (flash_sm90.cu), where it applies */
    kn_status st = kn_cu_flash_fwd_sm90(a, (int)q->ne[3], bf, (int)q->ne[0]);
    if (!st) fa_runs[3]++;
    if (st == KN_ERR_UNSUPPORTED) st = fa_fwd_dispatch<false>(a, (int)q->ne[3], bf, (int)q->ne[0]);
    if (!st) fa_runs[0]++;
    return st;
}

/* 218 registers (D = 64, CUDA 13's ptxas) and 65 KiB of shared memory: 2 blocks an SM.
 * Capping the registers at 168 for 3 blocks (__launch_bounds__(128, 3))
 * ran GPT-2's step at the same speed on an H100 (session 14). */
template <int D, bool BF> static kn_status fa_launch_bwd(const fa_bwd_args &a, dim3 grid) {
    size_t smem = fa_bwd_smem(D);
    static bool attr = false;
    if (!attr) { kn_status st = fa_smem_attr(k_flash_bwd<D, BF>, smem); if (st) return st; attr = true; }
    k_flash_bwd<D, BF><<<grid, 128, smem, kn_cu_stream()>>>(a);
    if (cudaGetLastError() != cudaSuccess) return kn_set_error(KN_ERR_BACKEND, "sdpa backward: flash kernel launch failed");
    return KN_OK;
}
static kn_status fa_bwd_dispatch(const fa_bwd_args &a, int D, bool bf, dim3 grid) {
    if (D == 64) return bf ? fa_launch_bwd<64, true>(a, grid) : fa_launch_bwd<64, false>(a, grid);
    return bf ? fa_launch_bwd<128, true>(a, grid) : fa_launch_bwd<128, false>(a, grid);
}

/* KN_OP_SDPA_BWD (sources q, k, v, g, y; output dq | dk | dv packed) */
kn_status kn_cu_flash_bwd(const kn_exec *e) {
    const kn_tview *q = &e->src[0], *k = &e->src[1], *g = &e->src[3], *y = &e->dst, *yf = e->nsrc > 4 ? &e->src[4] : NULL;
    bool bf;
    if (!fa_fits(e, &bf) || !fa_view_ok(g, q->dtype, q->ne[3]) || (y->dtype != q->dtype && y->dtype != KN_F32) ||
        y->ndim != 1 || y->st[0] != 1 || !kn_aligned16(y->data) || !yf || yf->dtype != q->dtype || yf->ndim != 4 || yf->ne[0] != q->ne[0] ||
        yf->ne[1] != q->ne[1] || yf->ne[2] != q->ne[2] || yf->ne[3] != q->ne[3])
        return KN_ERR_UNSUPPORTED;
    int64_t B = q->ne[0], Hq = q->ne[1], Tq = q->ne[2], D = q->ne[3], Hkv = k->ne[1], Tk = k->ne[2];
    int64_t rows = B * Hq * Tq, nq = rows * D, nk = B * Hkv * Tk * D;
    /* L_i kept by the forward (kn__aux_bytes: only an sdpa node has one, so
     * src_aux[4] is y's node's): the flash forward wrote it, because this
     * kernel's conditions (fa_fits on the same q, k, v, y in q's dtype) are
     * the forward's, so the forward node took flash too */
    float *kept = e->src_aux[4] && fa_view_ok(yf, q->dtype, D) ? (float *)e->src_aux[4] : NULL;
    float *lse = kept, *dd = NULL, *acc = NULL;
    kn_status st = kept ? KN_OK : kn_cu_tmp(sizeof(float) * (size_t)rows, (void **)&lse);
    if (!st) st = kn_cu_tmp(sizeof(float) * (size_t)rows, (void **)&dd);
    if (!st) st = kn_cu_tmp(sizeof(float) * (size_t)nq, (void **)&acc);
    if (!st && cudaMemsetAsync(acc, 0, sizeof(float) * (size_t)nq, kn_cu_stream()) != cudaSuccess)
        st = kn_set_error(KN_ERR_BACKEND, "sdpa backward: memset of the dq scratch failed");
    if (!st && kept) {                                   /* 1. D_i (L_i kept) */
        unsigned blocks = (unsigned)((rows * 8 + 255) / 256);
        int64_t gs[3], ys[3];
        fa_strides(g, gs);
        fa_strides(yf, ys);
        if (bf) k_flash_dd<true><<<blocks, 256, 0, kn_cu_stream()>>>(dd, (const uint16_t *)g->data, (const uint16_t *)yf->data,
                                                                     gs[0], gs[1], gs[2], ys[0], ys[1], ys[2], (int)Hq, (int)Tq, (int)D, rows);
        else k_flash_dd<false><<<blocks, 256, 0, kn_cu_stream()>>>(dd, (const uint16_t *)g->data, (const uint16_t *)yf->data,
                                                                    gs[0], gs[1], gs[2], ys[0], ys[1], ys[2], (int)Hq, (int)Tq, (int)D, rows);
        if (cudaGetLastError() != cudaSuccess) st = kn_set_error(KN_ERR_BACKEND, "sdpa backward: D_i kernel launch failed");
    } else if (!st) {                                    /* 1. L_i and D_i (the pre-pass) */
        fa_fwd_args a = fa_fwd_from(e);
        a.g = (const uint16_t *)g->data;
        fa_strides(g, a.gs);
        a.yin = (const uint16_t *)yf->data;
        for (int d = 0; d < 4; d++) a.yis[d] = yf->ne[d] > 1 ? yf->st[d] : 0;
        a.lse = lse; a.dd = dd;
        st = fa_fwd_dispatch<true>(a, (int)D, bf, (int)B);
    }
    if (!st) {                                           /* 2. dK, dV and the dQ scratch */
        const kn_tview *v = &e->src[2];
        fa_bwd_args a;
        memset(&a, 0, sizeof a);
        a.q = (const uint16_t *)q->data; a.k = (const uint16_t *)k->data; a.v = (const uint16_t *)v->data;
        a.g = (const uint16_t *)g->data;
        fa_strides(q, a.qs); fa_strides(k, a.ks); fa_strides(v, a.vs); fa_strides(g, a.gs);
        a.lse = lse; a.dd = dd; a.dq = acc;
        size_t es = y->dtype == KN_F32 ? 4 : 2;
        a.dk = (char *)y->data + es * (size_t)nq;
        a.dv = (char *)y->data + es * (size_t)(nq + nk);
        a.odt = (int)y->dtype;
        a.Hq = (int)Hq; a.Hkv = (int)Hkv; a.G = (int)(Hq / Hkv); a.Tq = (int)Tq; a.Tk = (int)Tk;
        a.causal = e->node->p.sdpa.causal;
        a.scale = (float)e->node->p.sdpa.scale;
        a.sl2 = (float)(e->node->p.sdpa.scale * 1.4426950408889634);
        dim3 grid((unsigned)((Tk + 63) / 64), (unsigned)Hkv, (unsigned)B);
        st = fa_bwd_dispatch(a, (int)D, bf, grid);
    }
    if (!st) {                                           /* 3. dq in the output dtype */
        k_flash_dq<<<kn_blocks(nq / 4), KN_THREADS, 0, kn_cu_stream()>>>(y->data, (int)y->dtype, acc, lse, nq, (int)D);
        if (cudaGetLastError() != cudaSuccess) st = kn_set_error(KN_ERR_BACKEND, "sdpa backward: dq kernel launch failed");
    }
    if (!kept) kn_cu_tmp_free(lse);
    kn_cu_tmp_free(dd);
    kn_cu_tmp_free(acc);
    if (!st) fa_runs[1]++;
    if (!st && kept) fa_runs[2]++;
    return st;
}
