/* flash.cuh: what flash_attn.cu (the sm_80 mma.sync kernels) and
 * flash_sm90.cu (the sm_90a wgmma forward) share: the forward's arguments
 * and the small device helpers of the online softmax and the stores.
 * Internal: not installed. */
#pragma once
#include "backends/cuda/cuda_ops.cuh"

struct fa_fwd_args {
    const uint16_t *q, *k, *v;        /* element strides [b, h, t] below; unit along D */
    int64_t qs[3], ks[3], vs[3];
    void *y;                          /* [B,Hq,Tq,D] in ydt, strides ys (NULL in the pre-pass) */
    int64_t ys[4];
    int ydt, ypair;                   /* ypair: ys[3] = 1 and pairs of y's elements aligned (fa_store_rows) */
    const uint16_t *g;                /* pre-pass: dO [B,Hq,Tq,D], strides gs */
    int64_t gs[3];
    const uint16_t *yin;              /* pre-pass: the forward's y [B,Hq,Tq,D] (q's dtype), strides yis */
    int64_t yis[4];
    float *lse, *dd;                  /* pre-pass: L_i, D_i [B*Hq*Tq]; forward: L_i or NULL */
    int Hq, G, Tq, Tk, causal;
    float sl2;                        /* scale * log2(e) */
};

/* 2^x on the SFU (flush to zero; 2^-inf = 0) */
__device__ __forceinline__ float fa_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
/* a row's log2 sum-exp from its running max m and sum l (log2 domain), -inf
 * for a row with no visible key: one formula for the forward that keeps it
 * and the pre-pass that recomputes it, so the two give the same bits */
__device__ __forceinline__ float fa_lse(float m, float l) { return l > 0.f ? m + log2f(l) : -INFINITY; }
/* a store in the destination dtype (the reference's rounding: RNE) */
__device__ __forceinline__ void fa_store(void *p, int dt, int64_t i, float x) {
    if (dt == KN_F32) ((float *)p)[i] = x;
    else if (dt == KN_BF16) ((uint16_t *)p)[i] = kn_f2bf(x);
    else ((uint16_t *)p)[i] = kn_dev_f2h(x);
}

/* The block's (tile rank, head, batch) from its linear index, the rank
 * varying slowest: every (b, h) takes its rank-0 tile (the longest, under a
 * causal mask) before any takes rank 1. With the rank fastest, as the grid
 * is laid out, the last heads' longest tiles started when most blocks were
 * done and ran alone at the end. */
__device__ __forceinline__ void fa_block(int &rank, int &h, int &b) {
    const int nbh = gridDim.y * gridDim.z;
    const int L = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    rank = L / nbh;
    h = L % nbh % gridDim.y;
    b = L % nbh / gridDim.y;
}

/* c[n][0..3] of a thread (rows g, g+8 of 16; columns n*8 + 2t, +1) stored
 * as pairs: one 4-byte store (16-bit) or 8-byte store (f32) a pair; row
 * pointers ra, rb (NULL: the row is past the end), elements */
template <int N, bool BF>
__device__ __forceinline__ void fa_store_rows(void *ra, void *rb, int odt, const float (*c)[4], int t) {
    if (odt == KN_F32) {
#pragma unroll
        for (int n = 0; n < N; n++) {
            if (ra) *(float2 *)((float *)ra + n * 8 + 2 * t) = make_float2(c[n][0], c[n][1]);
            if (rb) *(float2 *)((float *)rb + n * 8 + 2 * t) = make_float2(c[n][2], c[n][3]);
        }
    } else {
#pragma unroll
        for (int n = 0; n < N; n++) {
            if (ra) *(uint32_t *)((uint16_t *)ra + n * 8 + 2 * t) = kn_pack16<BF>(c[n][0], c[n][1]);
            if (rb) *(uint32_t *)((uint16_t *)rb + n * 8 + 2 * t) = kn_pack16<BF>(c[n][2], c[n][3]);
        }
    }
}

/* A kernel's dynamic shared memory above the default 48 KB */
template <typename K> static kn_status fa_smem_attr(K kern, size_t smem) {
    KN_CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    return KN_OK;
}

/* The sm_90a forward (flash_sm90.cu) for a.y != NULL: KN_OK when it ran,
 * KN_ERR_UNSUPPORTED (no message) where it does not apply (another GPU, a
 * head dimension other than 64 or 128, operands TMA cannot map, too few key
 * tiles a block to be worth it, KN_CUDA_TUNE=flash_sm90=0) and the caller
 * takes the mma.sync kernels. B: batch entries. */
kn_status kn_cu_flash_fwd_sm90(const fa_fwd_args &a, int D, bool bf, int B);
