/* flash_sm90.cu: the sdpa forward (KN_OP_SDPA) on Hopper's wgmma and TMA,
 * for bf16/f16 q, k, v with head dimension 64 or 128; what it does not take
 * goes to flash_attn.cu's mma.sync kernels (kn_cu_flash_fwd asks here first).
 *
 * Shapes as flash_attn.cu states them: q [B,Hq,Tq,D], k and v [B,Hkv,Tk,D],
 * query head h reads key/value head h / G; causal: key j is visible to query
 * i iff j <= i + (Tk - Tq); a row with no visible key is a NaN row.
 *
 * A block of 3 warpgroups takes 128 query rows of one (b, h):
 *  - warpgroup 0 is the producer: one thread loads the block's Q once and
 *    streams K and V tiles of 128 keys through a ring of 2 stages by TMA
 *    (4-D tensor maps over the [B,H,T,D] views, so a tile never reads past
 *    its head: rows past T are zero-filled), K and V on barriers of their
 *    own so that S = Q K^T can start before V has landed;
 *  - warpgroups 1 and 2 are consumers, 64 query rows each: S = Q K^T by
 *    wgmma m64n128k16 from shared memory (Q and K K-major), the online
 *    softmax in f32 in registers (log2 domain, as flash_attn.cu), then
 *    O += P V by wgmma with P in registers: an m64n128 accumulator's
 *    columns 16c .. 16c+15, packed in pairs, are the A fragment of k-slice
 *    c, so P never goes through shared memory; V is read MN-major (its rows
 *    are keys, the product's k) with wgmma's transpose bit. Each consumer
 *    hands a stage back after its P V.
 * Shared memory (1024-aligned for the 128-byte swizzle): Q as D/64 boxes of
 * 128 rows x 128 bytes; per stage K as D/64 boxes of 128 keys x 128 bytes
 * and V as (128/64) x (D/64) boxes of 64 keys x 64 values (8 KB), then the
 * barriers. D = 64: 80 KB, D = 128: 160 KB; one block an SM.
 * The output (y in its dtype, the row log-sum-exp for the gradient) is
 * stored from the accumulators as flash_attn.cu's forward stores it.
 */
#include "backends/cuda/flash.cuh"
#include "backends/cuda/sm90.cuh"
#include "backends/cuda/tune.cuh"     // defines: kn_cuda_tune (KN_CUDA_TUNE=flash_sm90=0|1)

#define FA9_BR 128     /* query rows a block (two consumers of 64) */
#define FA9_BC 128     /* keys a tile */
#define FA9_ST 2       /* stages of the K/V ring */

static constexpr int fa9_smem(int D) { return FA9_BR * D * 2 + 2 * FA9_ST * FA9_BC * D * 2 + 1024 + 64; }

template <int D, bool BF>
__global__ void __launch_bounds__(384, 1)
k_fa9_fwd(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
          const __grid_constant__ CUtensorMap tv, const fa_fwd_args a) {
#ifdef KN_SM90A_DEVICE
    constexpr int NB = D / 64, Q_BYTES = FA9_BR * D * 2, KV_BYTES = FA9_BC * D * 2;
    extern __shared__ uint8_t fa9_raw[];
    uint8_t *base = (uint8_t *)(((uintptr_t)fa9_raw + 1023) & ~(uintptr_t)1023);
    uint8_t *sQ = base, *sK = base + Q_BYTES, *sV = sK + FA9_ST * KV_BYTES;
    uint64_t *qfull = (uint64_t *)(sV + FA9_ST * KV_BYTES);
    uint64_t *kfull = qfull + 1, *vfull = kfull + FA9_ST, *empty = vfull + FA9_ST;
    int tile, h, b;
    fa_block(tile, h, b);
    tile = gridDim.x - 1 - tile;                          /* the longest causal tiles first */
    const int hk = h / a.G, i0 = tile * FA9_BR, off = a.Tk - a.Tq;
    int kend = a.Tk;                                      /* keys [0, kend) can be visible to this block */
    if (a.causal) kend = min(a.Tk, min(i0 + FA9_BR, a.Tq) + off);
    const int nkt = kend > 0 ? (kend + FA9_BC - 1) / FA9_BC : 0;
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    if (threadIdx.x == 0) {
        mbar_init(qfull, 1);
        for (int s = 0; s < FA9_ST; s++) { mbar_init(&kfull[s], 1); mbar_init(&vfull[s], 1); mbar_init(&empty[s], 2); }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        if (tid == 0) {
            mbar_expect_tx(qfull, Q_BYTES);
#pragma unroll
            for (int db = 0; db < NB; db++) tma_load_4d(sQ + db * FA9_BR * 128, &tq, 64 * db, i0, h, b, qfull);
            for (int kt = 0; kt < nkt; kt++) {
                const int s = kt % FA9_ST, j0 = kt * FA9_BC;
                if (kt >= FA9_ST) mbar_wait(&empty[s], ((kt / FA9_ST) - 1) & 1);
                uint8_t *k = sK + s * KV_BYTES, *v = sV + s * KV_BYTES;
                mbar_expect_tx(&kfull[s], KV_BYTES);
#pragma unroll
                for (int db = 0; db < NB; db++) tma_load_4d(k + db * FA9_BC * 128, &tk, 64 * db, j0, hk, b, &kfull[s]);
                mbar_expect_tx(&vfull[s], KV_BYTES);
#pragma unroll
                for (int kb = 0; kb < FA9_BC / 64; kb++)
#pragma unroll
                    for (int nb = 0; nb < NB; nb++)
                        tma_load_4d(v + (kb * NB + nb) * 8192, &tv, 64 * nb, j0 + 64 * kb, hk, b, &vfull[s]);
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
        const int cw = wg - 1, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
        const int rw = i0 + 64 * cw;                      /* this consumer's first row */
        const int r0 = rw + 16 * warp + g;                /* the thread's rows r0 and r0 + 8 */
        float o[D / 2], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
#pragma unroll
        for (int e = 0; e < D / 2; e++) o[e] = 0.f;
        mbar_wait(qfull, 0);
        for (int kt = 0; kt < nkt; kt++) {
            const int s = kt % FA9_ST, j0 = kt * FA9_BC;
            const uint32_t ph = (kt / FA9_ST) & 1;
            const uint8_t *k = sK + s * KV_BYTES, *v = sV + s * KV_BYTES;
            /* S = Q K^T: [64 rows, 128 keys], accumulator j: row r0 (+8 for j & 2), key j0 + 8 (j/4) + 2t (+1) */
            float sc[64];
#pragma unroll
            for (int e = 0; e < 64; e++) sc[e] = 0.f;
            mbar_wait(&kfull[s], ph);
            asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++)
                wg_mma<128, 0, 0, !BF>(sc, wg_desc<0>(sQ + (kk / 4) * FA9_BR * 128 + cw * 8192 + (kk % 4) * 32),
                                       wg_desc<0>(k + (kk / 4) * FA9_BC * 128 + (kk % 4) * 32));
            asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
            asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
            /* the online softmax (flash_attn.cu's, on the wgmma fragment) */
            const bool edge = j0 + FA9_BC > a.Tk || (a.causal && j0 + FA9_BC - 1 > rw + off);
            float mx[2] = {m[0], m[1]};
#pragma unroll
            for (int e = 0; e < 64; e++) {
                float x = sc[e] * a.sl2;
                if (edge) {
                    const int j = j0 + (e / 4) * 8 + 2 * t + (e & 1), r = r0 + ((e & 2) ? 8 : 0);
                    if (j >= a.Tk || (a.causal && j > r + off)) x = -INFINITY;
                }
                sc[e] = x;
                mx[(e >> 1) & 1] = fmaxf(mx[(e >> 1) & 1], x);
            }
            float al[2], ms[2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
                ms[r] = mx[r] == -INFINITY ? 0.f : mx[r];    /* nothing visible yet: exp2(-inf) = 0 */
                al[r] = fa_exp2(m[r] - ms[r]);
                m[r] = mx[r];
                l[r] *= al[r];
            }
#pragma unroll
            for (int e = 0; e < D / 2; e++) o[e] *= al[(e >> 1) & 1];
            uint32_t pa[FA9_BC / 16][4];
#pragma unroll
            for (int c = 0; c < FA9_BC / 16; c++)
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const int e = 8 * c + 2 * q, r = q & 1;      /* pairs (e, e+1): rows r0 (q even), r0 + 8 (q odd) */
                    const float p0 = fa_exp2(sc[e] - ms[r]), p1 = fa_exp2(sc[e + 1] - ms[r]);
                    l[r] += p0 + p1;
                    pa[c][q] = kn_pack16<BF>(p0, p1);
                }
            /* O += P V over the tile's 128 keys, 16 a step */
            mbar_wait(&vfull[s], ph);
            asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
            for (int c = 0; c < FA9_BC / 16; c++)
                wg_mma_rs<D, 1, !BF>(o, pa[c], wg_desc<1>(v + (c / 4) * NB * 8192 + (c % 4) * 2048));
            asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
            asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
            if (tid == 0) mbar_arrive(&empty[s]);
        }
        /* y = O / l (a NaN row where nothing was visible) and L = m + log2 l */
        float inv[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
            inv[r] = 1.f / l[r];
        }
#pragma unroll
        for (int e = 0; e < D / 2; e++) {
            const int r = (e >> 1) & 1;
            o[e] = l[r] > 0.f ? o[e] * inv[r] : __int_as_float(0x7fc00000);
        }
        const int ra = r0, rb = r0 + 8;
        if (a.ypair) {
            const size_t es = a.ydt == KN_F32 ? 4 : 2;
            char *yb = (char *)a.y + (b * a.ys[0] + h * a.ys[1]) * es;
            fa_store_rows<D / 8, BF>(ra < a.Tq ? yb + ra * a.ys[2] * es : NULL, rb < a.Tq ? yb + rb * a.ys[2] * es : NULL,
                                     a.ydt, (const float(*)[4])o, t);
        } else {
#pragma unroll
            for (int e = 0; e < D / 2; e++) {
                const int r = (e & 2) ? rb : ra, c = (e / 4) * 8 + 2 * t + (e & 1);
                if (r < a.Tq) fa_store(a.y, a.ydt, b * a.ys[0] + h * a.ys[1] + r * a.ys[2] + c * a.ys[3], o[e]);
            }
        }
        if (a.lse && t == 0) {
            const int64_t lb = ((int64_t)b * a.Hq + h) * a.Tq;
            if (ra < a.Tq) a.lse[lb + ra] = fa_lse(m[0], l[0]);
            if (rb < a.Tq) a.lse[lb + rb] = fa_lse(m[1], l[1]);
        }
    }
#endif
}

/* A [B,H,T,D] view as a 4-D map {D, T, H, B}: strides in bytes, a dimension
 * of one element given its packed stride (the encoder wants every stride a
 * nonzero multiple of 16). box_t rows of 64 values. */
static kn_status fa9_map(CUtensorMap *m, const uint16_t *p, bool bf, int D, int T, int H, int B, const int64_t st[3],
                         uint32_t box_t) {
    const uint64_t dims[4] = {(uint64_t)D, (uint64_t)T, (uint64_t)H, (uint64_t)B};
    uint64_t bs[3];
    bs[0] = T > 1 ? (uint64_t)st[2] * 2 : (uint64_t)D * 2;
    bs[1] = H > 1 ? (uint64_t)st[1] * 2 : bs[0] * (uint64_t)T;
    bs[2] = B > 1 ? (uint64_t)st[0] * 2 : bs[1] * (uint64_t)H;
    const uint32_t box[4] = {64, box_t, 1, 1};
    return kn_sm90_map(m, p, !bf, 4, dims, bs, box, "sdpa (sm_90a)");
}

template <int D, bool BF>
static kn_status fa9_launch(const CUtensorMap &q, const CUtensorMap &k, const CUtensorMap &v, const fa_fwd_args &a,
                            int B) {
    static bool attr = false;
    if (!attr) { kn_status st = fa_smem_attr(k_fa9_fwd<D, BF>, fa9_smem(D)); if (st) return st; attr = true; }
    dim3 grid((unsigned)((a.Tq + FA9_BR - 1) / FA9_BR), (unsigned)a.Hq, (unsigned)B);
    k_fa9_fwd<D, BF><<<grid, 384, fa9_smem(D), kn_cu_stream()>>>(q, k, v, a);
    KN_CUDA_LAUNCHED();
    return KN_OK;
}

/* Which forwards take this kernel: 1 all it can run, 0 none, -1 (the
 * default) those with enough key tiles a block. A block starts by loading Q
 * and its first K/V tile with nothing to overlap them, and holds the whole
 * SM (one block of 384 threads an SM, 168 registers each), where the
 * mma.sync kernel keeps 2-3 blocks an SM in flight: on an H100 (session 21)
 * it is 1.8x faster at D = 128 (Llama, T = 2048), 1.06x at GPT-2's T = 1024,
 * D = 64 (4.5 key tiles a block on average) and 0.82x at the char GPT's
 * T = 256 (1.5). KN_CUDA_TUNE=flash_sm90=0|1 sets it, flash_sm90_kt the
 * least average of key tiles for D = 64 (default 3); tests flip it with
 * kn_cu_flash_sm90_mode. */
static int fa9_mode = -2, fa9_kt = 3;
extern "C" void kn_cu_flash_sm90_mode(int mode) { fa9_mode = mode; }

static bool fa9_worth(const fa_fwd_args &a, int D) {
    if (fa9_mode == -2) {
        fa9_mode = kn_cuda_tune("flash_sm90", -1);
        fa9_kt = kn_cuda_tune("flash_sm90_kt", 3);
    }
    if (fa9_mode >= 0) return fa9_mode != 0;
    if (D == 128) return true;
    /* key tiles a block reads, averaged over the query tiles: all of them
     * without a mask, about half with a causal one */
    const int64_t kt = (a.Tk + FA9_BC - 1) / FA9_BC, qt = (a.Tq + FA9_BR - 1) / FA9_BR;
    const int64_t avg2 = a.causal ? 2 * (kt - qt) + qt + 1 : 2 * kt;    /* twice the average */
    return avg2 >= 2 * fa9_kt;
}

kn_status kn_cu_flash_fwd_sm90(const fa_fwd_args &a, int D, bool bf, int B) {
    if (!a.y || (D != 64 && D != 128) || !fa9_worth(a, D) || !kn_sm90_available()) return KN_ERR_UNSUPPORTED;
    const int Hkv = a.Hq / a.G;
    CUtensorMap mq, mk, mv;
    if (fa9_map(&mq, a.q, bf, D, a.Tq, a.Hq, B, a.qs, FA9_BR) || fa9_map(&mk, a.k, bf, D, a.Tk, Hkv, B, a.ks, FA9_BC) ||
        fa9_map(&mv, a.v, bf, D, a.Tk, Hkv, B, a.vs, 64)) {
        kn_clear_error();
        return KN_ERR_UNSUPPORTED;
    }
    if (D == 64) return bf ? fa9_launch<64, true>(mq, mk, mv, a, B) : fa9_launch<64, false>(mq, mk, mv, a, B);
    return bf ? fa9_launch<128, true>(mq, mk, mv, a, B) : fa9_launch<128, false>(mq, mk, mv, a, B);
}
