/* cuda_ops.cuh: shared pieces of the CUDA backend's generic kernels.
 *
 * Every generic kernel reads and writes its operands through a kn_dview (a
 * kn_tview passed by value to the kernel: data pointer, dtype, run-time
 * extents and element strides, any layout), converting each element to
 * double in registers and back with the reference backend's store rules
 * (float RNE first, then f16/bf16 RNE; integers truncate and saturate, NaN
 * becomes 0; bool is v != 0). Arithmetic is done in double like the
 * reference, so results match it to rounding. Fast paths (f32 GEMM,
 * softmax, norms) call the hand-tuned kernels of kn_cuda.h.
 *
 * Internal to src/backends/cuda; host functions here are called by the
 * dispatch switch in cuda_backend.cu.
 */
#pragma once
#include "backends/cuda/common.cuh"
extern "C" {
#include "backends/backend_impl.h"
#include "core/env.h"
}
#include <math.h>

/* Device copy of a kn_tview (passed by value into kernels). */
struct kn_dview {
    char *data;
    int dtype, ndim;
    int64_t ne[KN_MAX_DIMS], st[KN_MAX_DIMS];
};

static inline kn_dview kn_dv(const kn_tview *v) {
    kn_dview d;
    d.data = (char *)v->data;
    d.dtype = (int)v->dtype;
    d.ndim = v->ndim;
    for (int i = 0; i < KN_MAX_DIMS; i++) {
        d.ne[i] = i < v->ndim ? v->ne[i] : 1;
        d.st[i] = i < v->ndim ? v->st[i] : 0;
    }
    return d;
}

/* ---- element access ---------------------------------------------------------- */
__device__ __forceinline__ float kn_dev_h2f(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, ex = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (ex == 0x1f) return __uint_as_float(sign | 0x7f800000u | (man << 13));
    if (ex == 0) {
        if (!man) return __uint_as_float(sign);
        float f = (float)man * (1.0f / 16777216.0f);
        return sign ? -f : f;
    }
    return __uint_as_float(sign | ((ex + 112) << 23) | (man << 13));
}
/* the same bit recipe as src/core/fp16.h (round to nearest even) */
__device__ __forceinline__ uint16_t kn_dev_f2h(float f) {
    uint32_t u = __float_as_uint(f), sign = (u >> 16) & 0x8000, a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (a > 0x7f800000u ? 0x200 : 0));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);
    if (a < 0x38800000u) {
        float v = __uint_as_float(a) * 16777216.0f;
        uint32_t m = (uint32_t)v;
        float r = v - (float)m;
        if (r > 0.5f || (r == 0.5f && (m & 1))) m++;
        return (uint16_t)(sign | m);
    }
    uint32_t mant = a & 0x7fffff, ex = (a >> 23) - 112;
    uint32_t h = (ex << 10) | (mant >> 13), rest = mant & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

__device__ __forceinline__ double kn_dld(int dt, const char *base, int64_t i) {
    switch (dt) {
    case KN_F32: return ((const float *)base)[i];
    case KN_F64: return ((const double *)base)[i];
    case KN_F16: return kn_dev_h2f(((const uint16_t *)base)[i]);
    case KN_BF16: return kn_bf2f(((const uint16_t *)base)[i]);
    case KN_I8: return ((const int8_t *)base)[i];
    case KN_I32: return ((const int32_t *)base)[i];
    case KN_I64: return (double)((const int64_t *)base)[i];
    case KN_U8: return ((const uint8_t *)base)[i];
    case KN_BOOL: return ((const uint8_t *)base)[i] != 0;
    default: return __longlong_as_double(0x7ff8000000000000ll);
    }
}
__device__ __forceinline__ int64_t kn_dsat(double v, double lo, double hi) {
    if (isnan(v)) return 0;
    if (v <= lo) return (int64_t)lo;
    if (v >= hi) return (int64_t)hi;
    return (int64_t)v;
}
__device__ __forceinline__ void kn_dst(int dt, char *base, int64_t i, double v) {
    switch (dt) {
    case KN_F32: ((float *)base)[i] = (float)v; break;
    case KN_F64: ((double *)base)[i] = v; break;
    case KN_F16: ((uint16_t *)base)[i] = kn_dev_f2h((float)v); break;
    case KN_BF16: ((uint16_t *)base)[i] = kn_f2bf((float)v); break;
    case KN_I8: ((int8_t *)base)[i] = (int8_t)kn_dsat(v, -128, 127); break;
    case KN_I32: ((int32_t *)base)[i] = (int32_t)kn_dsat(v, -2147483648.0, 2147483647.0); break;
    case KN_I64: ((int64_t *)base)[i] = kn_dsat(v, -9.2233720368547758e18, 9.2233720368547748e18); break;
    case KN_U8: ((uint8_t *)base)[i] = (uint8_t)kn_dsat(v, 0, 255); break;
    case KN_BOOL: ((uint8_t *)base)[i] = v != 0; break;
    default: break;
    }
}
/* element offset of row-major linear index lin over v's extents. Below
 * 2^31 the divisions are 32-bit (a 64-bit division is a long emulated
 * sequence: the generic copies and the index_copy writes of an 8B-shaped
 * prompt ran at 0.2-0.4 TB/s on them); an extent above the remaining index
 * takes all of it. */
__device__ __forceinline__ int64_t kn_doff(const kn_dview &v, int64_t lin) {
    int64_t o = 0;
    if (lin <= INT32_MAX) {
        uint32_t l = (uint32_t)lin;
        for (int d = v.ndim - 1; d >= 0 && l; d--) {
            if (v.ne[d] > (int64_t)l) { o += (int64_t)l * v.st[d]; break; }
            uint32_t n = (uint32_t)v.ne[d];
            o += (int64_t)(l % n) * v.st[d];
            l /= n;
        }
        return o;
    }
    for (int d = v.ndim - 1; d >= 0; d--) {
        int64_t n = v.ne[d];
        o += (lin % n) * v.st[d];
        lin /= n;
    }
    return o;
}
__device__ __forceinline__ double kn_dget(const kn_dview &v, int64_t off) { return kn_dld(v.dtype, v.data, off); }
__device__ __forceinline__ void kn_dput(const kn_dview &v, int64_t off, double x) { kn_dst(v.dtype, v.data, off, x); }

/* grid-stride loop over [0, n) */
#define KN_GRID_LOOP(i, n) \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

#define KN_THREADS 256
static inline unsigned kn_blocks(int64_t n) {
    int64_t b = (n + KN_THREADS - 1) / KN_THREADS;
    if (b < 1) b = 1;
    if (b > 65536) b = 65536;
    return (unsigned)b;
}

/* Block-wide double sum / max; blockDim.x = KN_THREADS; every thread gets the result. */
__device__ __forceinline__ double kn_dblock_sum(double v, double *sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ double kn_dblock_max(double v, double *sh) {  /* NaN ignored (fmax) */
    for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* ---- host side: stream, transfers, temporaries, errors, family entry points ---- */
/* The backend's one non-blocking stream: every launch, memset and copy of
 * the backend goes to it (launches: <<<grid, block, smem, kn_cu_stream()>>>;
 * the kn_cuda_* kernels get it as their stream argument). */
cudaStream_t kn_cu_stream(void);
/* Host <-> device copies on that stream through the pinned staging buffers;
 * kn_cu_h2d returns once queued (host memory reusable), kn_cu_d2h once done. */
kn_status kn_cu_h2d(void *dst, const void *host, size_t n);
kn_status kn_cu_d2h(void *host, const void *src, size_t n);
/* Device scratch from the backend's pool (stream-ordered on kn_cu_stream(),
 * so release right after the last launch that uses it is safe). */
kn_status kn_cu_tmp(size_t bytes, void **p);
void kn_cu_tmp_free(void *p);
/* The pool itself, under kn_cu_tmp (which routes a capture's scratch to its graph). */
kn_status kn_cu_pool_take(size_t bytes, void **p);
void kn_cu_pool_give(void *p);

/* ---- capture and replay (cuda_graph.cu) ---- */
/* While a graph is captured: the device array [KN_MAX_SYMS + 1] of symbol
 * values its kernels may read (a kernel that reads extent x of an operand
 * from it reports that symbol in kn_cu_dynamic_syms); NULL otherwise, when
 * kernels take every extent as a host argument. */
const int64_t *kn_cu_capture_syms(void);
/* The device array of symbol values every generated kernel and captured graph
 * reads (cuda_graph.cu; NULL when it cannot be allocated); is a capture running? */
int64_t *kn_cu_dev_syms(void);
bool kn_cu_capturing(void);
/* KN_CUDA_TRACE (cuda_backend.cu): on? then begin drains the stream and
 * starts the clock, end stops it and gives the device time in us */
bool kn_cu_trace_on(void);
kn_status kn_cu_trace_begin(void);
kn_status kn_cu_trace_end(double *us);
kn_status kn_cu_graph_tmp(size_t bytes, void **p);
bool kn_cu_graph_tmp_free(void *p);    /* false: not a block of the capture */
uint64_t kn_cu_dynamic_syms(kn_backend *be, const kn_exec *e);
kn_status kn_cu_capture_begin(kn_backend *be, const int64_t *syms, int n);
kn_status kn_cu_capture_end(kn_backend *be, bool keep, void **graph);
kn_status kn_cu_graph_launch(kn_backend *be, void *graph, const int64_t *syms, int n);
void kn_cu_graph_free(kn_backend *be, void *graph);
/* sdpa (cuda_ops_nn.cu): the symbol bits its decode kernel reads on the device */
uint64_t kn_cu_sdpa_dynamic_syms(const kn_exec *e);

/* Kernels that can find bad data (index out of range, integer division by
 * zero) record the first problem of their op kind in that op's slot
 * (kn_cu_err_dev(op)); the host does not wait for it: kn_cu_err_collect(),
 * run by the backend's synchronize at the end of every plan, reads the
 * slots, clears them and turns a problem into a message naming the op. A
 * kernel skips the elements with bad indices (it never writes out of
 * bounds); index_copy writes nothing when its slot is set. */
struct kn_cu_err {
    int code;          /* 0 none, 1 index out of range, 2 integer division by zero, 3 class target out of range (dim: ignore_index) */
    int dim;
    double value;
    int64_t size;
};
kn_cu_err *kn_cu_err_dev(kn_op op);   /* device pointer to op's slot */
kn_status kn_cu_err_collect(void);
void kn_cu_err_arm(void);             /* a graph launch: slots may be set, collect at the next sync */
static_assert(sizeof(kn_cu_err) == sizeof(kn_kerr) && offsetof(kn_cu_err, value) == offsetof(kn_kerr, value) &&
              offsetof(kn_cu_err, size) == offsetof(kn_kerr, size), "generated kernels write kn_cu_err as kn_kerr");
__device__ __forceinline__ void kn_cu_err_set(kn_cu_err *e, int code, int dim, double value, int64_t size) {
    if (atomicCAS(&e->code, 0, code) == 0) { e->dim = dim; e->value = value; e->size = size; }
}

/* Store a row-major double buffer acc[n] into the view y. */
kn_status kn_cu_store_all(const kn_tview *y, const double *acc, int64_t n);
/* Load the view x (row-major order) into a double buffer acc[n]. */
kn_status kn_cu_load_all(const kn_tview *x, double *acc, int64_t n);

/* Same-dtype gather of 2- or 4-byte elements into a contiguous dst[n]:
 * element i, unravelled row-major over ne[nd], sits at coordinates c; with
 * j = c - lo (lo NULL: 0), dst[i] = src[sum j*st] when 0 <= j < sne in every
 * dim (sne NULL: no bounds), else the bit pattern fill. Index math in
 * 32 bits and no conversion through double: the permute copies and
 * constant pads of a training step. KN_ERR_UNSUPPORTED (no message) when
 * n or an extent does not fit 32 bits, or esize is not 2 or 4. */
kn_status kn_cu_gather_bits(void *dst, const void *src, int esize, int nd, const int64_t *ne, const int64_t *st,
                            const int64_t *lo, const int64_t *sne, uint32_t fill, int64_t n);

/* Views v[0..nv) of es-byte elements (same extents) as views of 16-byte
 * words, for copies that move bits (a thread a word instead of an element):
 * when every view runs the last dim with stride 1, that run and every other
 * stride are whole words, and the data is 16-byte aligned. false: v unchanged. */
static inline bool kn_cu_words16(kn_tview *const *v, int nv, int es) {
    if (es <= 0 || 16 % es) return false;
    int64_t k = 16 / es;
    for (int i = 0; i < nv; i++) {
        int nd = v[i]->ndim;
        if (nd < 1 || v[i]->st[nd - 1] != 1 || v[i]->ne[nd - 1] % k || ((uintptr_t)v[i]->data & 15)) return false;
        for (int d = 0; d < nd - 1; d++) if (v[i]->st[d] % k) return false;
    }
    for (int i = 0; i < nv; i++) {
        int nd = v[i]->ndim;
        v[i]->ne[nd - 1] /= k;
        for (int d = 0; d < nd - 1; d++) v[i]->st[d] /= k;
    }
    return true;
}

kn_status kn_cu_create(const kn_exec *e);
kn_status kn_cu_copy(const kn_exec *e);      /* COPY CAST ASSIGN TRI WHERE */
/* collectives through NCCL and their ordering (cuda_dist.cu) */
extern "C" kn_status kn_cu_comm(const kn_exec *e);                     /* ALL_REDUCE ALL_GATHER REDUCE_SCATTER BROADCAST */
extern "C" kn_status kn_cu_comm_before(const kn_exec *e);              /* wait for pending outputs e touches */
extern "C" kn_status kn_cu_comm_before_kernel(char *const *bufs, int n);
extern "C" kn_status kn_cu_comm_join(void);                            /* wait for every pending collective */
extern "C" kn_status kn_cu_comm_sync(void);                            /* join + stream wait with a timeout */
extern "C" void kn_cu_bind(void);                                      /* this thread uses the backend's GPU */
kn_status kn_cu_optim(const kn_exec *e);     /* ADAM_UPDATE */
bool kn_cu_batch_ok(kn_backend *be, const kn_exec *e);                  /* kn_backend.batch_ok: f32 ADAM_UPDATE */
kn_status kn_cu_compute_batch(kn_backend *be, const kn_exec *es, int n);  /* kn_backend.compute_batch */
kn_status kn_cu_unary(const kn_exec *e);
kn_status kn_cu_binary(const kn_exec *e);
kn_status kn_cu_reduce(const kn_exec *e);
kn_status kn_cu_scan(const kn_exec *e);
kn_status kn_cu_matmul(const kn_exec *e);
/* What the GEMV kernels can do in their store: y = res + act(dot + bias)
 * (f32 [N] contiguous device vectors or NULL; act 0 or an activation op),
 * and a prologue before their dot (pre, kn_cuda.h). */
typedef struct { const float *bias; int act; const float *res; kn_cuda_gemv_pre pre; } kn_cu_gemv_epi;
/* The product alone (e->epi ignored), with ge (NULL: none) done in the
 * kernel where it can be: *done = 2 all of ge, 1 only its bias, 0 none.
 * A prologue (ge->pre.kind) runs in the kernel or not at all: then
 * KN_ERR_UNSUPPORTED, nothing launched, no error recorded. */
kn_status kn_cu_matmul_gemv_epi(const kn_exec *e, const kn_cu_gemv_epi *ge, int *done);
/* cuda_ops_quant.cu: the same for a GGUF-quantized right operand (a weight
 * kept as stored): kn_cu_matmul_gemv_epi branches here */
kn_status kn_cu_matmul_quant(const kn_exec *e, const kn_cu_gemv_epi *ge, int *done);
/* gemv.cu: the GEMV with that epilogue; KN_ERR_UNSUPPORTED: not launched */
extern "C" kn_status kn_cuda_gemv_epi(int wt, float *y, const void *W, const float *x, const float *bias, int act,
                                      const float *res, int64_t N, int64_t K, const kn_cuda_gemv_pre *pre, int wfix,
                                      void *stream);
/* cuda_ops_epilogue.cu: a matmul with its epilogue (kn_epilogue) */
kn_status kn_cu_matmul_epilogue(const kn_exec *e);
bool kn_cu_epilogue_ok(kn_backend *be, const kn_tensor *mm, const kn_epilogue *epi, kn_dtype out);
kn_status kn_cu_index(const kn_exec *e);     /* CAT PAD GATHER SCATTER(_ADD) INDEX_SELECT/ADD/COPY */
kn_status kn_cu_nn(const kn_exec *e);
kn_status kn_cu_sdpa_bwd(const kn_exec *e);  /* SDPA_BWD (cuda_ops_attn.cu) */
kn_status kn_cu_paged_attn(const kn_exec *e);  /* PAGED_ATTN (cuda_paged_attn.cu) */
/* flash_attn.cu: 16-bit sdpa forward / backward on the tensor cores;
 * KN_ERR_UNSUPPORTED (no message) when the operands do not fit */
kn_status kn_cu_flash_fwd(const kn_exec *e);
kn_status kn_cu_flash_bwd(const kn_exec *e);
kn_status kn_cu_cross_entropy(const kn_exec *e);  /* CROSS_ENTROPY(_BWD) (cuda_ops_loss.cu) */
kn_status kn_cu_moe(const kn_exec *e);            /* TOPK, MUL_MAT_ID (cuda_ops_moe.cu) */
kn_status kn_cu_sort(const kn_exec *e);           /* SORT (cuda_ops_sort.cu) */
