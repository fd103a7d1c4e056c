/* bench.cu: test + benchmark driver for src/backends/cuda (kiln issue 5).
 * Every kernel is checked against a CPU double-precision reference on fresh
 * random inputs (seed printed), with the output poisoned with NaN first
 * (NaN never passes: errors are compared with !(err <= tol)), then timed with
 * cudaEvents (warm-up, median of repeats) next to cuBLAS or the device-to-
 * device copy bandwidth measured in the same run. Prints a table last.
 * Usage: bench [--quick | --tests]   (exit code 1 if any check failed);
 * --tests runs only the small correctness cases (for compute-sanitizer). */
#include "backends/cuda/kn_cuda.h"
#include "kernels/kernels.h"          // the kernels no node calls yet
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "sgemm/v1_naive.cu"
#include "sgemm/v2_smem.cu"
#include "sgemm/v3_blocktile2d.cu"
#include "sgemm/v4_vectorized.cu"
#include "sgemm/v6_warplayout.cu"

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(2); } } while (0)
#define CKB(x) do { cublasStatus_t s_ = (x); if (s_ != CUBLAS_STATUS_SUCCESS) { \
    fprintf(stderr, "%s:%d: %s: cublas status %d\n", __FILE__, __LINE__, #x, (int)s_); exit(2); } } while (0)
#define KN(x) do { kn_status s_ = (x); if (s_ != KN_OK) { \
    fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #x, kn_status_str(s_), kn_last_error()); exit(2); } } while (0)

/* ---- rng, buffers ----------------------------------------------------------- */
static uint64_t g_rng;
static uint64_t rnd64() { uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull); z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull; z = (z ^ (z >> 27)) * 0x94D049BB133111EBull; return z ^ (z >> 31); }
static float rndu() { return (float)((rnd64() >> 40) * (1.0 / 16777216.0)); }        // [0,1)
static float rndn() { return rndu() * 2.f - 1.f; }                                     // [-1,1)
static std::vector<float> randv(size_t n, float scale = 1.f) { std::vector<float> v(n); for (auto &x : v) x = rndn() * scale; return v; }
static uint16_t f2bf(float f) { uint32_t u; memcpy(&u, &f, 4); u += 0x7fff + ((u >> 16) & 1); return (uint16_t)(u >> 16); }
static float bf2f(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }

template <typename T> static T *dnew(size_t n) { T *p; CK(cudaMalloc(&p, n * sizeof(T) + 16)); return p; }
template <typename T> static T *dup(const std::vector<T> &v) { T *p = dnew<T>(v.size()); CK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice)); return p; }
template <typename T> static std::vector<T> down(const T *p, size_t n) { std::vector<T> v(n); CK(cudaDeviceSynchronize()); CK(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost)); return v; }
template <typename T> static void poison(T *p, size_t n) { CK(cudaMemset(p, 0xFF, n * sizeof(T))); }   // f32/bf16 NaN
static std::vector<float> bfv(const std::vector<uint16_t> &h) { std::vector<float> v(h.size()); for (size_t i = 0; i < h.size(); i++) v[i] = bf2f(h[i]); return v; }

static double relerr(const std::vector<float> &out, const std::vector<double> &ref) {
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); i++) { double d = (double)out[i] - ref[i]; num += d * d; den += ref[i] * ref[i]; }
    if (den == 0) den = 1;
    return std::sqrt(num / den);           // NaN in out -> NaN
}
static double relerr_f(const std::vector<float> &out, const std::vector<float> &ref) {
    std::vector<double> r(ref.begin(), ref.end()); return relerr(out, r);
}

/* ---- timing ---------------------------------------------------------------- */
static bool g_quick = false;
static bool g_tests_only = false;   /* --tests: small correctness cases only (for compute-sanitizer) */
static float time_ms(const std::function<void()> &f, int warm = 3, int iters = 20) {
    if (g_quick) { warm = 1; iters = std::min(iters, 5); }
    cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
    for (int i = 0; i < warm; i++) f();
    CK(cudaDeviceSynchronize());
    std::vector<float> t;
    for (int i = 0; i < iters; i++) {
        CK(cudaEventRecord(a)); f(); CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b));
        float ms; CK(cudaEventElapsedTime(&ms, a, b)); t.push_back(ms);
    }
    CK(cudaGetLastError());
    CK(cudaEventDestroy(a)); CK(cudaEventDestroy(b));
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

/* Per-launch time in a stream of n back-to-back launches (median of reps):
 * what a decode loop sees, where the host queues the next kernel while the
 * GPU runs this one. time_ms above times one launch alone, host submission
 * included (an empty kernel: ~4 us on the H200 machine). */
static float time_ms_stream(const std::function<void()> &f, int n = 20, int reps = 10) {
    if (g_quick) reps = 3;
    cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
    for (int i = 0; i < 3; i++) f();
    CK(cudaDeviceSynchronize());
    std::vector<float> t;
    for (int r = 0; r < reps; r++) {
        CK(cudaEventRecord(a));
        for (int i = 0; i < n; i++) f();
        CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b));
        float ms; CK(cudaEventElapsedTime(&ms, a, b)); t.push_back(ms / n);
    }
    CK(cudaGetLastError());
    CK(cudaEventDestroy(a)); CK(cudaEventDestroy(b));
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

/* ---- results ----------------------------------------------------------------- */
struct Row { std::string name, size; double us, rate; std::string unit; double ratio; std::string vs; double err; bool ok; };
static std::vector<Row> g_rows;
static int g_fail = 0;
static double g_copy_gbs = 0;
static void check(const char *name, const std::string &what, double err, double tol) {
    bool ok = err <= tol;                  // NaN fails
    if (!ok) g_fail++;
    printf("  %-5s %-28s %-30s relerr %.3g (tol %.0e)\n", ok ? "ok" : "FAIL", name, what.c_str(), err, tol);
}
static void checkb(const char *name, const std::string &what, bool ok) {
    if (!ok) g_fail++;
    printf("  %-5s %-28s %s\n", ok ? "ok" : "FAIL", name, what.c_str());
}
static void row_bw(const std::string &name, const std::string &size, float ms, double bytes, double err, bool ok) {
    double gbs = bytes / (ms * 1e-3) / 1e9;
    g_rows.push_back({name, size, ms * 1e3, gbs, "GB/s", gbs / g_copy_gbs, "copy", err, ok});
}
static void row_fl(const std::string &name, const std::string &size, float ms, double flops, float ref_ms, const char *vs, double err, bool ok) {
    double tf = flops / (ms * 1e-3) / 1e12;
    g_rows.push_back({name, size, ms * 1e3, tf, "TFLOP/s", ref_ms > 0 ? ref_ms / ms : 0, vs, err, ok});
}
static std::string sz(std::initializer_list<long long> d) { std::string s; for (auto x : d) { if (!s.empty()) s += "x"; s += std::to_string(x); } return s; }

static cublasHandle_t g_blas;

/* ================================================================================= */
static void bench_copy() {
    size_t n = (size_t)1 << 30;   // bytes
    char *a = dnew<char>(n), *b = dnew<char>(n);
    CK(cudaMemset(a, 1, n));
    float ms = time_ms([&] { CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice)); }, 3, 20);
    g_copy_gbs = 2.0 * n / (ms * 1e-3) / 1e9;
    g_rows.push_back({"d2d copy (ceiling)", "1GiB", ms * 1e3, g_copy_gbs, "GB/s", 1.0, "copy", 0, true});
    printf("copy bandwidth: %.0f GB/s (read+write)\n", g_copy_gbs);
    CK(cudaFree(a)); CK(cudaFree(b));
}

/* ---- floors: what a launch and a bare read cost (for the small kernels) ----------- */
__global__ void floor_empty_kernel() {}
/* Sum of x[0, n4) float4s, 4 loads in flight per thread; one store per warp
 * (out[gridDim.x * blockDim.x / 32]; no atomics on one address, which
 * serialize: the first version measured 25 us for a 32 MB read). */
__global__ void floor_read_kernel(const float4 *__restrict__ x, int64_t n4, float *out) {
    float s = 0.f;
    const int64_t T = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += 4 * T) {
        float4 v[4];
#pragma unroll
        for (int u = 0; u < 4; u++) v[u] = i + u * T < n4 ? __ldcs(x + i + u * T) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int u = 0; u < 4; u++) s += v[u].x + v[u].y + v[u].z + v[u].w;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) out[(blockIdx.x * blockDim.x + threadIdx.x) >> 5] = s;
}
static void bench_floor() {
    printf("[floor] empty launch, bare reads\n");
    cudaDeviceProp pr; CK(cudaGetDeviceProperties(&pr, 0));
    float ms = time_ms([&] { floor_empty_kernel<<<1, 32>>>(); }, 5, 100);
    g_rows.push_back({"empty kernel (floor)", "1x32", ms * 1e3, 0, "-", 0, "-", 0, true});
    ms = time_ms_stream([&] { floor_empty_kernel<<<1, 32>>>(); });
    g_rows.push_back({"empty kernel, stream", "1x32", ms * 1e3, 0, "-", 0, "-", 0, true});
    float *out = dnew<float>((size_t)pr.multiProcessorCount * 8 * 256 / 32);
    struct S { const char *name; size_t bytes; int rot; } cases[] = {
        {"read 1x151936 f32", 151936 * 4, 1}, {"read 64x151936 f32", (size_t)64 * 151936 * 4, 1},
        {"read 32MB rot4", (size_t)32 << 20, 4}, {"read 64MB rot4", (size_t)64 << 20, 4}};
    for (auto c : cases) {
        std::vector<float *> bufs;
        for (int r = 0; r < c.rot; r++) { float *b = dnew<float>(c.bytes / 4); CK(cudaMemset(b, 0, c.bytes)); bufs.push_back(b); }
        int64_t n4 = c.bytes / 16;
        int grid = (int)std::min<int64_t>((n4 + 255) / 256, (int64_t)pr.multiProcessorCount * 8);
        int it = 0;
        float t = time_ms([&] { floor_read_kernel<<<grid, 256>>>((const float4 *)bufs[it++ % c.rot], n4, out); }, 5, 50);
        row_bw(std::string(c.name) + " (floor)", std::to_string(grid) + " blocks", t, (double)c.bytes, 0, true);
        t = time_ms_stream([&] { floor_read_kernel<<<grid, 256>>>((const float4 *)bufs[it++ % c.rot], n4, out); });
        row_bw(std::string(c.name) + ", stream", std::to_string(grid) + " blocks", t, (double)c.bytes, 0, true);
        for (auto b : bufs) CK(cudaFree(b));
    }
    CK(cudaFree(out));
}

/* ---- SGEMM -------------------------------------------------------------------- */
static void ref_gemm(bool ta, bool tb, int M, int N, int K, float alpha, const std::vector<float> &A, const std::vector<float> &B,
                     float beta, const std::vector<float> &C0, std::vector<double> &out) {
    out.assign((size_t)M * N, 0);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += (double)(ta ? A[(size_t)k * M + m] : A[(size_t)m * K + k]) * (tb ? B[(size_t)n * K + k] : B[(size_t)k * N + n]);
            out[(size_t)m * N + n] = alpha * s + (beta != 0 ? beta * (double)C0[(size_t)m * N + n] : 0.0);
        }
}
static void cublas_sgemm(bool ta, bool tb, int M, int N, int K, const float *A, const float *B, float *C) {
    float one = 1, zero = 0;
    CKB(cublasSgemm(g_blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &one,
                    B, tb ? K : N, A, ta ? M : K, &zero, C, N));
}
static void test_sgemm() {
    printf("[sgemm] correctness vs CPU double\n");
    struct S { int M, N, K; bool ta, tb; float alpha, beta; } cases[] = {
        {256, 384, 128, false, false, 1, 0}, {256, 384, 128, false, true, 1, 0}, {256, 384, 128, true, false, 1, 0},
        {256, 384, 128, true, true, 1, 0}, {260, 132, 100, false, false, 1.5f, 0.5f}, {1000, 1004, 996, false, true, 1, 0},
        {129, 67, 33, false, false, 1, 0}, {129, 67, 33, true, true, 2, -1}, {256, 256, 64, false, false, 1.5f, 0.5f}};
    for (auto c : cases) {
        auto A = randv((size_t)c.M * c.K), B = randv((size_t)c.K * c.N), C0 = randv((size_t)c.M * c.N);
        float *dA = dup(A), *dB = dup(B), *dC = dup(C0);
        if (c.beta == 0) poison(dC, (size_t)c.M * c.N);
        KN(kn_cuda_sgemm(c.ta, c.tb, c.M, c.N, c.K, c.alpha, dA, c.ta ? c.M : c.K, dB, c.tb ? c.K : c.N, c.beta, dC, c.N, NULL));
        std::vector<double> ref; ref_gemm(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A, B, c.beta, C0, ref);
        char w[96]; snprintf(w, sizeof w, "%dx%dx%d %c%c a=%g b=%g", c.M, c.N, c.K, c.ta ? 'T' : 'N', c.tb ? 'T' : 'N', c.alpha, c.beta);
        check("kn_cuda_sgemm", w, relerr(down(dC, (size_t)c.M * c.N), ref), 1e-5);
        CK(cudaFree(dA)); CK(cudaFree(dB)); CK(cudaFree(dC));
    }
    kn_status s = kn_cuda_sgemm(false, false, -1, 4, 4, 1, NULL, 4, NULL, 4, 0, NULL, 4, NULL);
    checkb("kn_cuda_sgemm", std::string("bad shape -> KN_ERR_INVALID: ") + kn_last_error(), s == KN_ERR_INVALID);
}
/* sampled CPU check of a large product: 256 random entries */
static double sample_err(bool ta, bool tb, int M, int N, int K, const std::vector<float> &A, const std::vector<float> &B, const std::vector<float> &C) {
    double num = 0, den = 0;
    for (int t = 0; t < 256; t++) {
        int m = rnd64() % M, n = rnd64() % N; double s = 0;
        for (int k = 0; k < K; k++) s += (double)(ta ? A[(size_t)k * M + m] : A[(size_t)m * K + k]) * (tb ? B[(size_t)n * K + k] : B[(size_t)k * N + n]);
        double d = C[(size_t)m * N + n] - s; num += d * d; den += s * s;
    }
    return std::sqrt(num / den);
}
static void bench_sgemm() {
    printf("[sgemm] ladder + library vs cuBLAS\n");
    for (int n : {4096, 8192}) {
        if (g_quick && n > 4096) break;
        size_t e = (size_t)n * n;
        auto A = randv(e), B = randv(e);
        float *dA = dup(A), *dB = dup(B), *dC = dnew<float>(e), *dR = dnew<float>(e);
        double fl = 2.0 * n * n * (double)n;
        std::string s = sz({n, n, n});
        for (int mode = 0; mode < 3; mode++) {      // NN, NT, TN
            bool ta = mode == 2, tb = mode == 1;
            if (n > 4096 && mode) break;
            const char *mn = mode == 0 ? "NN" : mode == 1 ? "NT" : "TN";
            poison(dR, e);
            float rms = time_ms([&] { cublas_sgemm(ta, tb, n, n, n, dA, dB, dR); }, 2, n > 4096 ? 5 : 10);
            auto R = down(dR, e);
            poison(dC, e);
            KN(kn_cuda_sgemm(ta, tb, n, n, n, 1, dA, n, dB, n, 0, dC, n, NULL));
            auto Cv = down(dC, e);
            double err = relerr_f(Cv, R), serr = sample_err(ta, tb, n, n, n, A, B, Cv), cerr = sample_err(ta, tb, n, n, n, A, B, R);
            char w[96]; snprintf(w, sizeof w, "%s %s vs cublas", s.c_str(), mn);
            check("kn_cuda_sgemm", w, err, 1e-5);
            snprintf(w, sizeof w, "%s %s sampled vs CPU (cublas %.2g)", s.c_str(), mn, cerr);
            check("kn_cuda_sgemm", w, serr, 1e-5);
            float ms = time_ms([&] { kn_cuda_sgemm(ta, tb, n, n, n, 1, dA, n, dB, n, 0, dC, n, NULL); }, 2, n > 4096 ? 5 : 10);
            g_rows.push_back({std::string("cublasSgemm ") + mn, s, rms * 1e3, fl / (rms * 1e-3) / 1e12, "TFLOP/s", 1.0, "cublas", cerr, true});
            row_fl(std::string("kn_cuda_sgemm ") + mn, s, ms, fl, rms, "cublas", err, err <= 1e-5);
            if (mode == 0 && n == 4096) {
                void (*vs[6])(int, int, int, const float *, const float *, float *) = {sgemm_v1, sgemm_v2, sgemm_v3, sgemm_v4, sgemm_v6_bk8, sgemm_v6_bk16};
                const char *vn[6] = {"sgemm v1 naive", "sgemm v2 smem", "sgemm v3 2d-tile", "sgemm v4 float4", "sgemm v6 warp bk8", "sgemm v6 warp bk16"};
                for (int v = 0; v < 6; v++) {
                    poison(dC, e);
                    vs[v](n, n, n, dA, dB, dC); CK(cudaGetLastError());
                    double ev = relerr_f(down(dC, e), R);
                    snprintf(w, sizeof w, "%s %s vs cublas", s.c_str(), vn[v]);
                    check("dev sgemm ladder", w, ev, 1e-5);
                    float vms = time_ms([&] { vs[v](n, n, n, dA, dB, dC); }, 1, v < 2 ? 3 : 10);
                    row_fl(vn[v], s, vms, fl, rms, "cublas", ev, ev <= 1e-5);
                }
            }
        }
        CK(cudaFree(dA)); CK(cudaFree(dB)); CK(cudaFree(dC)); CK(cudaFree(dR));
    }
}

/* ---- softmax ------------------------------------------------------------------ */
static void ref_softmax(const std::vector<float> &x, int rows, int cols, std::vector<double> &y) {
    y.resize(x.size());
    for (int r = 0; r < rows; r++) {
        double m = -1e300, s = 0;
        for (int i = 0; i < cols; i++) m = std::max(m, (double)x[(size_t)r * cols + i]);
        for (int i = 0; i < cols; i++) s += std::exp(x[(size_t)r * cols + i] - m);
        for (int i = 0; i < cols; i++) y[(size_t)r * cols + i] = std::exp(x[(size_t)r * cols + i] - m) / s;
    }
}
static void test_bench_softmax() {
    printf("[softmax]\n");
    /* 6 x 65536, 5 x 100000: rows split over a cluster (uneven chunks); 2 x 300000:
     * too long for the register kernel (online path); row 0 of those two has its
     * first half at -inf (whole blocks / vectors of -inf must give 0, not NaN);
     * 4096 x 8192 and 64 x 65536 (row 0 half -inf): more rows than fit on the GPU
     * at once (several waves of blocks, of clusters); they tested the persistent
     * kernel of dev/cuda/softmax v5, which walked several rows per block */
    struct S { int rows, cols; bool bench; } cases[] = {{37, 1000, false}, {64, 4096, false}, {8, 50001, false}, {6, 65536, false},
                                                        {5, 100000, false}, {2, 300000, false}, {4096, 8192, false}, {64, 65536, false},
                                                        {8192, 4096, true}, {128, 131072, true}};
    for (auto c : cases) {
        if (g_tests_only && c.bench) continue;
        size_t n = (size_t)c.rows * c.cols;
        auto x = randv(n, 8.f);
        if (c.cols == 65536 || c.cols == 300000) for (int i = 0; i < c.cols / 2; i++) x[i] = -INFINITY;
        float *dx = dup(x), *dy = dnew<float>(n);
        poison(dy, n);
        KN(kn_cuda_softmax_f32(dy, dx, c.rows, c.cols, NULL));
        std::vector<double> ref; ref_softmax(x, c.rows, c.cols, ref);
        double err = relerr(down(dy, n), ref);
        std::string s = sz({c.rows, c.cols});
        check("kn_cuda_softmax_f32", s, err, 1e-5);
        if (c.bench) { float ms = time_ms([&] { kn_cuda_softmax_f32(dy, dx, c.rows, c.cols, NULL); }); row_bw("softmax f32", s, ms, 2.0 * n * 4, err, err <= 1e-5); }
        /* bf16 */
        std::vector<uint16_t> xb(n); for (size_t i = 0; i < n; i++) xb[i] = f2bf(x[i]);
        auto xr = bfv(xb);
        uint16_t *dxb = dup(xb), *dyb = dnew<uint16_t>(n);
        poison(dyb, n);
        KN(kn_cuda_softmax_bf16(dyb, dxb, c.rows, c.cols, NULL));
        ref_softmax(xr, c.rows, c.cols, ref);
        double eb = relerr(bfv(down(dyb, n)), ref);
        check("kn_cuda_softmax_bf16", s, eb, 1e-2);
        if (c.bench) { float ms = time_ms([&] { kn_cuda_softmax_bf16(dyb, dxb, c.rows, c.cols, NULL); }); row_bw("softmax bf16", s, ms, 2.0 * n * 2, eb, eb <= 1e-2); }
        CK(cudaFree(dx)); CK(cudaFree(dy)); CK(cudaFree(dxb)); CK(cudaFree(dyb));
    }
}

/* ---- norms --------------------------------------------------------------------- */
static void test_bench_norms() {
    printf("[layernorm / rmsnorm]\n");
    struct S { int rows, C; bool bench; } cases[] = {{64, 768, false}, {33, 1001, false}, {16, 12288, false}, {48, 2048, false}, {300, 8192, false}, {16384, 4096, true}};
    for (auto c : cases) {
        if (g_tests_only && c.bench) continue;
        size_t n = (size_t)c.rows * c.C;
        auto x = randv(n, 2.f), w = randv(c.C), b = randv(c.C), dy = randv(n);
        for (size_t i = 0; i < n; i++) x[i] += 0.5f;   // nonzero mean
        float *dx_ = dup(x), *dw = dup(w), *db = dup(b), *ddy = dup(dy), *dyo = dnew<float>(n), *dmean = dnew<float>(c.rows), *drstd = dnew<float>(c.rows);
        float *ddx = dnew<float>(n), *ddw = dnew<float>(c.C), *ddb = dnew<float>(c.C);
        std::string s = sz({c.rows, c.C});
        const float eps = 1e-5f;
        /* reference */
        std::vector<double> yref(n), dxref(n), dwref(c.C, 0), dbref(c.C, 0), ry(n), rdx(n), rdw(c.C, 0), rrstd(c.rows);
        std::vector<double> mu(c.rows), rs(c.rows);
        for (int r = 0; r < c.rows; r++) {
            const float *xr = &x[(size_t)r * c.C]; const float *g = &dy[(size_t)r * c.C];
            double m = 0, v = 0, ss = 0; for (int i = 0; i < c.C; i++) { m += xr[i]; ss += (double)xr[i] * xr[i]; }
            m /= c.C; for (int i = 0; i < c.C; i++) v += (xr[i] - m) * (xr[i] - m); v /= c.C;
            double rstd = 1 / std::sqrt(v + eps); mu[r] = m; rs[r] = rstd;
            double rr = 1 / std::sqrt(ss / c.C + eps); rrstd[r] = rr;
            double sg = 0, sgx = 0, rsgx = 0;
            for (int i = 0; i < c.C; i++) {
                double xh = (xr[i] - m) * rstd; yref[(size_t)r * c.C + i] = xh * w[i] + b[i];
                ry[(size_t)r * c.C + i] = xr[i] * rr * w[i];
                double gg = g[i] * w[i]; sg += gg; sgx += gg * xh; rsgx += gg * xr[i] * rr;
                dwref[i] += g[i] * xh; dbref[i] += g[i]; rdw[i] += g[i] * xr[i] * rr;
            }
            sg /= c.C; sgx /= c.C; rsgx /= c.C;
            for (int i = 0; i < c.C; i++) {
                double xh = (xr[i] - m) * rstd, gg = g[i] * w[i];
                dxref[(size_t)r * c.C + i] = rstd * (gg - sg - xh * sgx);
                rdx[(size_t)r * c.C + i] = rr * (gg - xr[i] * rr * rsgx);
            }
        }
        /* layer norm fwd */
        poison(dyo, n); poison(dmean, c.rows); poison(drstd, c.rows);
        KN(kn_cuda_layernorm_fwd(dyo, dmean, drstd, dx_, dw, db, c.rows, c.C, eps, NULL));
        double e1 = relerr(down(dyo, n), yref);
        double e1s = std::max(relerr(down(dmean, c.rows), mu), relerr(down(drstd, c.rows), rs));
        check("kn_cuda_layernorm_fwd", s + " y", e1, 1e-5);
        check("kn_cuda_layernorm_fwd", s + " mean/rstd", e1s, 1e-5);
        if (c.bench) { float ms = time_ms([&] { kn_cuda_layernorm_fwd(dyo, dmean, drstd, dx_, dw, db, c.rows, c.C, eps, NULL); }); row_bw("layernorm fwd", s, ms, 2.0 * n * 4, e1, e1 <= 1e-5); }
        /* layer norm bwd (uses the kernel's mean/rstd) */
        poison(ddx, n); CK(cudaMemset(ddw, 0, c.C * 4)); CK(cudaMemset(ddb, 0, c.C * 4));
        KN(kn_cuda_layernorm_bwd(ddx, ddw, ddb, ddy, dx_, dw, dmean, drstd, c.rows, c.C, NULL));
        double e2 = relerr(down(ddx, n), dxref), e2w = std::max(relerr(down(ddw, c.C), dwref), relerr(down(ddb, c.C), dbref));
        check("kn_cuda_layernorm_bwd", s + " dx", e2, 1e-5);
        check("kn_cuda_layernorm_bwd", s + " dw,db", e2w, 1e-5);
        if (c.bench) { float ms = time_ms([&] { kn_cuda_layernorm_bwd(ddx, ddw, ddb, ddy, dx_, dw, dmean, drstd, c.rows, c.C, NULL); }); row_bw("layernorm bwd", s, ms, 3.0 * n * 4, e2, e2 <= 1e-5); }
        /* rms norm */
        poison(dyo, n); poison(drstd, c.rows);
        KN(kn_cuda_rmsnorm_fwd(dyo, drstd, dx_, dw, c.rows, c.C, eps, NULL));
        double e3 = relerr(down(dyo, n), ry), e3s = relerr(down(drstd, c.rows), rrstd);
        check("kn_cuda_rmsnorm_fwd", s, std::max(e3, e3s), 1e-5);
        if (c.bench) { float ms = time_ms([&] { kn_cuda_rmsnorm_fwd(dyo, drstd, dx_, dw, c.rows, c.C, eps, NULL); }); row_bw("rmsnorm fwd", s, ms, 2.0 * n * 4, e3, e3 <= 1e-5); }
        poison(ddx, n); CK(cudaMemset(ddw, 0, c.C * 4));
        KN(kn_cuda_rmsnorm_bwd(ddx, ddw, ddy, dx_, dw, drstd, c.rows, c.C, NULL));
        double e4 = relerr(down(ddx, n), rdx), e4w = relerr(down(ddw, c.C), rdw);
        check("kn_cuda_rmsnorm_bwd", s + " dx", e4, 1e-5);
        check("kn_cuda_rmsnorm_bwd", s + " dw", e4w, 1e-5);
        if (c.bench) { float ms = time_ms([&] { kn_cuda_rmsnorm_bwd(ddx, ddw, ddy, dx_, dw, drstd, c.rows, c.C, NULL); }); row_bw("rmsnorm bwd", s, ms, 3.0 * n * 4, e4, e4 <= 1e-5); }
        /* rms norm bf16 */
        std::vector<uint16_t> xb(n); for (size_t i = 0; i < n; i++) xb[i] = f2bf(x[i]);
        uint16_t *dxb = dup(xb), *dyb = dnew<uint16_t>(n);
        poison(dyb, n);
        KN(kn_cuda_rmsnorm_fwd_bf16(dyb, drstd, dxb, dw, c.rows, c.C, eps, NULL));
        std::vector<double> rb(n);
        for (int r = 0; r < c.rows; r++) { double ss = 0; for (int i = 0; i < c.C; i++) { double t = bf2f(xb[(size_t)r * c.C + i]); ss += t * t; }
            double rr = 1 / std::sqrt(ss / c.C + eps); for (int i = 0; i < c.C; i++) rb[(size_t)r * c.C + i] = bf2f(xb[(size_t)r * c.C + i]) * rr * w[i]; }
        double e5 = relerr(bfv(down(dyb, n)), rb);
        check("kn_cuda_rmsnorm_fwd_bf16", s, e5, 1e-2);
        if (c.bench) { float ms = time_ms([&] { kn_cuda_rmsnorm_fwd_bf16(dyb, drstd, dxb, dw, c.rows, c.C, eps, NULL); }); row_bw("rmsnorm fwd bf16", s, ms, 2.0 * n * 2, e5, e5 <= 1e-2); }
        for (float *p : {dx_, dw, db, ddy, dyo, dmean, drstd, ddx, ddw, ddb}) CK(cudaFree(p));
        CK(cudaFree(dxb)); CK(cudaFree(dyb));
    }
}

/* ---- cross-entropy ------------------------------------------------------------- */
static void test_bench_ce() {
    printf("[crossentropy]\n");
    struct S { int B, V; bool bench; } cases[] = {{16, 1000, false}, {8, 50257, false}, {3, 200000, false}, {40, 32000, false}, {600, 50304, false}, {2048, 50304, true}};
    for (auto c : cases) {
        if (g_tests_only && c.bench) continue;
        size_t n = (size_t)c.B * c.V;
        auto x = randv(n, 4.f);
        std::vector<int32_t> t(c.B); for (int b = 0; b < c.B; b++) t[b] = (b % 7 == 3) ? -1 : (int)(rnd64() % c.V);
        float *dx = dup(x), *dl = dnew<float>(c.B), *dg = dnew<float>(n); int32_t *dt = dup(t);
        float dloss = 1.f / c.B;
        std::vector<double> rl(c.B), rg(n);
        for (int b = 0; b < c.B; b++) {
            const float *xr = &x[(size_t)b * c.V]; double m = -1e300, s = 0;
            for (int i = 0; i < c.V; i++) m = std::max(m, (double)xr[i]);
            for (int i = 0; i < c.V; i++) s += std::exp(xr[i] - m);
            bool valid = t[b] >= 0; rl[b] = valid ? std::log(s) + m - xr[t[b]] : 0;
            for (int i = 0; i < c.V; i++) rg[(size_t)b * c.V + i] = valid ? dloss * (std::exp(xr[i] - m) / s - (i == t[b])) : 0;
        }
        poison(dl, c.B); poison(dg, n);
        KN(kn_cuda_crossentropy_fwd_bwd(dl, dg, dx, dt, c.B, c.V, dloss, NULL));
        std::string s = sz({c.B, c.V});
        double el = relerr(down(dl, c.B), rl), eg = relerr(down(dg, n), rg);
        check("kn_cuda_crossentropy", s + " loss", el, 1e-5);
        check("kn_cuda_crossentropy", s + " dlogits", eg, 1e-5);
        /* in place */
        float *dx2 = dup(x); poison(dl, c.B);
        KN(kn_cuda_crossentropy_fwd_bwd(dl, dx2, dx2, dt, c.B, c.V, dloss, NULL));
        check("kn_cuda_crossentropy", s + " in-place dlogits", relerr(down(dx2, n), rg), 1e-5);
        if (c.bench) { float ms = time_ms([&] { kn_cuda_crossentropy_fwd_bwd(dl, dg, dx, dt, c.B, c.V, dloss, NULL); }); row_bw("crossentropy fwd+bwd", s, ms, 2.0 * n * 4, eg, eg <= 1e-5);
        }
        CK(cudaFree(dx)); CK(cudaFree(dx2)); CK(cudaFree(dl)); CK(cudaFree(dg)); CK(cudaFree(dt));
    }
}

/* ---- AdamW --------------------------------------------------------------------- */
static void test_bench_adamw() {
    printf("[adamw]\n");
    for (size_t n : {(size_t)1000003, (size_t)1 << 26}) {
        if (g_tests_only && n > 1000003) continue;
        auto p = randv(n), g = randv(n), m = randv(n, 0.1f), v = randv(n, 0.01f);
        for (auto &q : v) q = std::fabs(q);
        float *dp = dup(p), *dg = dup(g), *dm = dup(m), *dv = dup(v);
        const float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f; const int t = 7;
        KN(kn_cuda_adamw(dp, dm, dv, dg, (int64_t)n, lr, b1, b2, eps, wd, t, NULL));
        std::vector<double> rp(n), rm(n), rv(n);
        double c1 = 1 - std::pow(0.9, t), c2 = 1 - std::pow(0.95, t);
        for (size_t i = 0; i < n; i++) {
            double mm = b1 * (double)m[i] + (1 - (double)b1) * g[i], vv = b2 * (double)v[i] + (1 - (double)b2) * (double)g[i] * g[i];
            rm[i] = mm; rv[i] = vv;
            rp[i] = p[i] - lr * ((mm / c1) / (std::sqrt(vv / c2) + eps) + wd * p[i]);
        }
        /* compare the update (p_new - p_old) so that p's size does not hide errors */
        auto P = down(dp, n); std::vector<float> up(n); std::vector<double> rup(n);
        for (size_t i = 0; i < n; i++) { up[i] = P[i] - p[i]; rup[i] = rp[i] - p[i]; }
        double e = std::max(relerr(up, rup), std::max(relerr(down(dm, n), rm), relerr(down(dv, n), rv)));
        std::string s = std::to_string(n);
        check("kn_cuda_adamw", s + " (update, m, v)", e, 1e-4);
        if (n > 1000003) { float ms = time_ms([&] { kn_cuda_adamw(dp, dm, dv, dg, (int64_t)n, lr, b1, b2, eps, wd, t, NULL); }); row_bw("adamw", s, ms, 28.0 * n, e, e <= 1e-4); }
        for (float *q : {dp, dg, dm, dv}) CK(cudaFree(q));
    }
}

/* ---- RoPE ------------------------------------------------------------------------ */
static void test_bench_rope() {
    printf("[rope]\n");
    struct S { int ntok, nh, hd; bool bench; } cases[] = {{64, 8, 128, false}, {17, 3, 64, false}, {16384, 32, 128, true}};
    for (auto c : cases) {
        if (g_tests_only && c.bench) continue;
        size_t n = (size_t)c.ntok * c.nh * c.hd;
        auto x = randv(n);
        std::vector<int32_t> pos(c.ntok); for (int i = 0; i < c.ntok; i++) pos[i] = (int)(rnd64() % 4096);
        float *dx = dup(x), *dy = dnew<float>(n); int32_t *dp = dup(pos);
        const float theta = 10000.f;
        for (int mode = 0; mode < 4; mode++) {
            bool neox = mode & 1, inv = mode & 2;
            std::vector<double> ref(n);
            int half = c.hd / 2;
            for (int t = 0; t < c.ntok; t++) for (int h = 0; h < c.nh; h++) for (int i = 0; i < half; i++) {
                double ang = pos[t] * std::pow((double)theta, -2.0 * i / c.hd) * (inv ? -1 : 1);
                size_t base = ((size_t)t * c.nh + h) * c.hd; size_t ia = neox ? base + i : base + 2 * i, ib = neox ? base + i + half : base + 2 * i + 1;
                ref[ia] = x[ia] * std::cos(ang) - x[ib] * std::sin(ang); ref[ib] = x[ia] * std::sin(ang) + x[ib] * std::cos(ang);
            }
            poison(dy, n);
            KN(kn_cuda_rope_f32(dy, dx, dp, c.ntok, c.nh, c.hd, theta, neox, inv, NULL));
            double e = relerr(down(dy, n), ref);
            std::string s = sz({c.ntok, c.nh, c.hd}) + (neox ? " neox" : " norm") + (inv ? " inv" : "");
            check("kn_cuda_rope_f32", s, e, 1e-4);   // f32 angle rounding: ~pos*6e-8 rad
            if (c.bench && mode == 0) { float ms = time_ms([&] { kn_cuda_rope_f32(dy, dx, dp, c.ntok, c.nh, c.hd, theta, false, false, NULL); }); row_bw("rope f32", s, ms, 2.0 * n * 4, e, e <= 1e-4); }
        }
        CK(cudaFree(dx)); CK(cudaFree(dy)); CK(cudaFree(dp));
    }
}

/* ---- embedding --------------------------------------------------------------------- */
static void test_bench_embedding() {
    printf("[embedding]\n");
    struct S { int n, V, C; bool bench; } cases[] = {{100, 1000, 768, false}, {50, 37, 99, false}, {16384, 50304, 4096, true}};
    for (auto c : cases) {
        if (g_tests_only && c.bench) continue;
        size_t tn = (size_t)c.V * c.C, on = (size_t)c.n * c.C;
        auto table = randv(tn), dout = randv(on);
        std::vector<int32_t> ids(c.n); for (int i = 0; i < c.n; i++) ids[i] = (int)(rnd64() % c.V);
        if (!c.bench) { ids[1] = ids[0]; ids[2] = ids[0]; ids[3] = -5; ids[4] = c.V; }  // repeats, out of range
        float *dt = dup(table), *dout_ = dnew<float>(on), *dg = dup(dout), *ddt = dnew<float>(tn); int32_t *di = dup(ids);
        poison(dout_, on);
        KN(kn_cuda_embedding_fwd(dout_, dt, di, c.n, c.V, c.C, NULL));
        std::vector<double> ref(on, 0), rt(tn, 0);
        for (int i = 0; i < c.n; i++) if (ids[i] >= 0 && ids[i] < c.V) for (int j = 0; j < c.C; j++) { ref[(size_t)i * c.C + j] = table[(size_t)ids[i] * c.C + j]; rt[(size_t)ids[i] * c.C + j] += dout[(size_t)i * c.C + j]; }
        std::string s = sz({c.n, c.V, c.C});
        double e = relerr(down(dout_, on), ref);
        check("kn_cuda_embedding_fwd", s, e, 0);
        CK(cudaMemset(ddt, 0, tn * 4));
        KN(kn_cuda_embedding_bwd(ddt, dg, di, c.n, c.V, c.C, NULL));
        double eb = relerr(down(ddt, tn), rt);
        check("kn_cuda_embedding_bwd", s, eb, 1e-6);
        if (c.bench) {
            float ms = time_ms([&] { kn_cuda_embedding_fwd(dout_, dt, di, c.n, c.V, c.C, NULL); });
            row_bw("embedding fwd", s, ms, 2.0 * on * 4, e, e <= 0);
            ms = time_ms([&] { kn_cuda_embedding_bwd(ddt, dg, di, c.n, c.V, c.C, NULL); });
            row_bw("embedding bwd (atomic)", s, ms, 3.0 * on * 4, eb, eb <= 1e-6);
        }
        CK(cudaFree(dt)); CK(cudaFree(dout_)); CK(cudaFree(dg)); CK(cudaFree(ddt)); CK(cudaFree(di));
    }
}

/* ---- gemv ------------------------------------------------------------------------------ */
static void test_bench_gemv() {
    printf("[gemv]\n");
    struct S { int N, K; int rot; bool bench; } cases[] = {{1000, 4096, 1, false}, {37, 1000, 1, false}, {4096, 4096, 4, true}, {16384, 8192, 1, true}};
    for (auto c : cases) {
        if (g_tests_only && c.bench) continue;
        size_t wn = (size_t)c.N * c.K;
        auto W = randv(wn), x = randv(c.K), bias = randv(c.N);
        std::vector<uint16_t> Wb(wn); for (size_t i = 0; i < wn; i++) Wb[i] = f2bf(W[i]);
        std::vector<uint16_t> xb(c.K); for (int i = 0; i < c.K; i++) xb[i] = f2bf(x[i]);
        std::vector<float *> dW; std::vector<uint16_t *> dWb;
        for (int r = 0; r < c.rot; r++) { dW.push_back(dup(W)); dWb.push_back(dup(Wb)); }
        float *dx = dup(x), *dbias = dup(bias), *dy = dnew<float>(c.N), *dyr = dnew<float>(c.N); uint16_t *dxb = dup(xb);
        std::vector<double> ref(c.N), refb(c.N);
        for (int r = 0; r < c.N; r++) { double s = 0, sb = 0; for (int k = 0; k < c.K; k++) { s += (double)W[(size_t)r * c.K + k] * x[k]; sb += (double)bf2f(Wb[(size_t)r * c.K + k]) * x[k]; } ref[r] = s + bias[r]; refb[r] = sb + bias[r]; }
        std::string s = sz({c.N, c.K});
        poison(dy, c.N);
        KN(kn_cuda_gemv_f32(dy, dW[0], dx, dbias, c.N, c.K, NULL));
        double e = relerr(down(dy, c.N), ref);
        check("kn_cuda_gemv_f32", s, e, 1e-5);
        poison(dy, c.N);
        KN(kn_cuda_gemv_bf16(dy, dWb[0], dx, dbias, c.N, c.K, NULL));
        double eb = relerr(down(dy, c.N), refb);
        check("kn_cuda_gemv_bf16", s, eb, 1e-5);    // f32 math on exactly-converted bf16 weights
        if (c.bench) {
            int it = 0; float one = 1, zero = 0;
            float ms = time_ms([&] { kn_cuda_gemv_f32(dy, dW[it++ % c.rot], dx, NULL, c.N, c.K, NULL); }, 5, 50);
            float rms = time_ms([&] { CKB(cublasSgemv(g_blas, CUBLAS_OP_T, c.K, c.N, &one, dW[it++ % c.rot], c.K, dx, 1, &zero, dyr, 1)); }, 5, 50);
            row_bw("gemv f32", s + (c.rot > 1 ? " rot4" : ""), ms, 4.0 * wn, e, e <= 1e-5);
            g_rows.push_back({"cublasSgemv", s, rms * 1e3, 4.0 * wn / (rms * 1e-3) / 1e9, "GB/s", 4.0 * wn / (rms * 1e-3) / 1e9 / g_copy_gbs, "copy", 0, true});
            float msb = time_ms([&] { kn_cuda_gemv_bf16(dy, dWb[it++ % c.rot], dx, NULL, c.N, c.K, NULL); }, 5, 50);
            float rmsb = time_ms([&] { CKB(cublasGemmEx(g_blas, CUBLAS_OP_T, CUBLAS_OP_N, c.N, 1, c.K, &one, dWb[it++ % c.rot], CUDA_R_16BF, c.K, dxb, CUDA_R_16BF, c.K, &zero, dyr, CUDA_R_32F, c.N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)); }, 5, 50);
            row_bw("gemv bf16", s + (c.rot > 1 ? " rot4" : ""), msb, 2.0 * wn, eb, eb <= 1e-5);
            g_rows.push_back({"cublasGemmEx bf16 n=1", s, rmsb * 1e3, 2.0 * wn / (rmsb * 1e-3) / 1e9, "GB/s", 2.0 * wn / (rmsb * 1e-3) / 1e9 / g_copy_gbs, "copy", 0, true});
            if (c.rot > 1) {       /* the small case in a stream of launches (decode loop) */
                ms = time_ms_stream([&] { kn_cuda_gemv_f32(dy, dW[it++ % c.rot], dx, NULL, c.N, c.K, NULL); });
                row_bw("gemv f32, stream", s + " rot4", ms, 4.0 * wn, e, e <= 1e-5);
                msb = time_ms_stream([&] { kn_cuda_gemv_bf16(dy, dWb[it++ % c.rot], dx, NULL, c.N, c.K, NULL); });
                row_bw("gemv bf16, stream", s + " rot4", msb, 2.0 * wn, eb, eb <= 1e-5);
            }
        }
        for (auto p : dW) CK(cudaFree(p));
        for (auto p : dWb) CK(cudaFree(p));
        CK(cudaFree(dx)); CK(cudaFree(dbias)); CK(cudaFree(dy)); CK(cudaFree(dyr)); CK(cudaFree(dxb));
    }
}

/* ---- bf16 GEMM ---------------------------------------------------------------------------- */
static double gelu_ref(double x) { return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
static void test_bench_gemm_bf16() {
    printf("[gemm bf16] wgmma path: %s\n", kn_cuda_gemm_bf16_uses_wgmma() ? "yes" : "NO (fallback)");
    struct S { int M, N, K; bool bias, gelu; } cases[] = {{256, 512, 192, false, false}, {256, 512, 192, true, true}, {200, 300, 136, true, false}, {128, 256, 64, false, true}, {1000, 1000, 1000, true, true}, {64, 96, 20, true, false}};
    for (auto c : cases) {
        std::vector<uint16_t> A((size_t)c.M * c.K), W((size_t)c.N * c.K);
        for (auto &a : A) a = f2bf(rndn()); for (auto &w : W) w = f2bf(rndn());
        auto bias = randv(c.N);
        uint16_t *dA = dup(A), *dW = dup(W), *dC = dnew<uint16_t>((size_t)c.M * c.N); float *db = dup(bias);
        poison(dC, (size_t)c.M * c.N);
        KN(kn_cuda_gemm_bf16(c.M, c.N, c.K, dA, dW, c.bias ? db : NULL, c.gelu ? KN_CUDA_EPI_GELU : KN_CUDA_EPI_NONE, dC, NULL));
        std::vector<double> ref((size_t)c.M * c.N);
        for (int m = 0; m < c.M; m++) for (int n = 0; n < c.N; n++) {
            double s = 0; for (int k = 0; k < c.K; k++) s += (double)bf2f(A[(size_t)m * c.K + k]) * bf2f(W[(size_t)n * c.K + k]);
            if (c.bias) s += bias[n]; if (c.gelu) s = gelu_ref(s); ref[(size_t)m * c.N + n] = s;
        }
        char w[96]; snprintf(w, sizeof w, "%dx%dx%d%s%s", c.M, c.N, c.K, c.bias ? " +bias" : "", c.gelu ? " gelu" : "");
        check("kn_cuda_gemm_bf16", w, relerr(bfv(down(dC, (size_t)c.M * c.N)), ref), 1e-2);
        CK(cudaFree(dA)); CK(cudaFree(dW)); CK(cudaFree(dC)); CK(cudaFree(db));
    }
    for (int n : {4096, 8192}) {
        if (g_tests_only) break;
        size_t e = (size_t)n * n;
        std::vector<uint16_t> A(e), W(e); for (auto &a : A) a = f2bf(rndn()); for (auto &x : W) x = f2bf(rndn());
        uint16_t *dA = dup(A), *dW = dup(W), *dC = dnew<uint16_t>(e), *dR = dnew<uint16_t>(e);
        auto bias = randv(n); float *db = dup(bias);
        float one = 1, zero = 0;
        auto cub = [&] { CKB(cublasGemmEx(g_blas, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, dW, CUDA_R_16BF, n, dA, CUDA_R_16BF, n, &zero, dR, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)); };
        poison(dR, e); cub();
        poison(dC, e);
        KN(kn_cuda_gemm_bf16(n, n, n, dA, dW, NULL, KN_CUDA_EPI_NONE, dC, NULL));
        auto Cv = bfv(down(dC, e)), Rv = bfv(down(dR, e));
        double err = relerr_f(Cv, Rv);
        /* sampled CPU check */
        double num = 0, den = 0;
        for (int t = 0; t < 256; t++) { int m = rnd64() % n, j = rnd64() % n; double s = 0; for (int k = 0; k < n; k++) s += (double)bf2f(A[(size_t)m * n + k]) * bf2f(W[(size_t)j * n + k]); double d = Cv[(size_t)m * n + j] - s; num += d * d; den += s * s; }
        double serr = std::sqrt(num / den);
        std::string s = sz({n, n, n});
        check("kn_cuda_gemm_bf16", s + " vs cublas", err, 1e-2);
        check("kn_cuda_gemm_bf16", s + " sampled vs CPU", serr, 1e-2);
        double fl = 2.0 * n * n * (double)n;
        int it = n > 4096 ? 10 : 30;
        /* interleave to even out clock drift: cublas, ours, cublas, ours */
        float r1 = time_ms(cub, 3, it);
        float m1 = time_ms([&] { kn_cuda_gemm_bf16(n, n, n, dA, dW, NULL, KN_CUDA_EPI_NONE, dC, NULL); }, 3, it);
        float r2 = time_ms(cub, 3, it);
        float m2 = time_ms([&] { kn_cuda_gemm_bf16(n, n, n, dA, dW, NULL, KN_CUDA_EPI_NONE, dC, NULL); }, 3, it);
        float rms = std::min(r1, r2), ms = std::min(m1, m2);
        g_rows.push_back({"cublasGemmEx bf16", s, rms * 1e3, fl / (rms * 1e-3) / 1e12, "TFLOP/s", 1.0, "cublas", 0, true});
        row_fl("gemm bf16 wgmma", s, ms, fl, rms, "cublas", err, err <= 1e-2);
        if (n == 4096) {
            float mg = time_ms([&] { kn_cuda_gemm_bf16(n, n, n, dA, dW, db, KN_CUDA_EPI_GELU, dC, NULL); }, 3, it);
            row_fl("gemm bf16 +bias+gelu", s, mg, fl, rms, "cublas", err, err <= 1e-2);
        }
        CK(cudaFree(dA)); CK(cudaFree(dW)); CK(cudaFree(dC)); CK(cudaFree(dR)); CK(cudaFree(db));
    }
}

/* ---- top-k / top-p -------------------------------------------------------------------------- */
static void test_bench_topk() {
    printf("[topk / topp]\n");
    /* dist 0: uniform in [-10, 10); 1: ties (multiples of 0.25); 2: narrow, [1, 2):
     * one top-digit bin holds the whole row, so the candidate lists of the
     * cluster kernels overflow (16 rows: clusters of 8, 18992-element chunks) */
    struct S { int rows, V, k, dist; bool bench; } cases[] = {{4, 50257, 50, 0, false}, {3, 32000, 1000, 1, false}, {2, 151936, 1, 0, false},
                                                              {5, 4001, 7, 0, false}, {2, 40000, 300, 1, false}, {16, 151936, 50, 2, false},
                                                              {1, 151936, 50, 0, true}, {64, 151936, 50, 0, true}};
    for (auto c : cases) {
        if (g_tests_only && c.bench) continue;
        size_t n = (size_t)c.rows * c.V;
        std::vector<float> x(n);
        for (auto &v : x) v = c.dist == 1 ? (float)(int)(rndn() * 20) * 0.25f : c.dist == 2 ? 1.f + rndu() : rndn() * 10;
        float *dx = dup(x), *dv = dnew<float>((size_t)c.rows * c.k); int32_t *di = dnew<int32_t>((size_t)c.rows * c.k);
        poison(dv, (size_t)c.rows * c.k); poison(di, (size_t)c.rows * c.k);
        KN(kn_cuda_topk_f32(dv, di, dx, c.rows, c.V, c.k, NULL));
        auto V = down(dv, (size_t)c.rows * c.k); auto I = down(di, (size_t)c.rows * c.k);
        bool ok = true;
        for (int r = 0; r < c.rows && ok; r++) {
            std::vector<float> srt(x.begin() + (size_t)r * c.V, x.begin() + (size_t)(r + 1) * c.V);
            std::partial_sort(srt.begin(), srt.begin() + c.k, srt.end(), std::greater<float>());
            std::vector<int> seen;
            for (int j = 0; j < c.k; j++) {
                int id = I[(size_t)r * c.k + j]; float v = V[(size_t)r * c.k + j];
                if (!(v == srt[j]) || id < 0 || id >= c.V || x[(size_t)r * c.V + id] != v) { ok = false; break; }
                seen.push_back(id);
            }
            std::sort(seen.begin(), seen.end());
            if (std::adjacent_find(seen.begin(), seen.end()) != seen.end()) ok = false;
        }
        std::string s = sz({c.rows, c.V}) + " k=" + std::to_string(c.k) + (c.dist == 1 ? " ties" : c.dist == 2 ? " narrow" : "");
        checkb("kn_cuda_topk_f32", s + " exact values, valid distinct idx", ok);
        if (c.bench) { float ms = time_ms([&] { kn_cuda_topk_f32(dv, di, dx, c.rows, c.V, c.k, NULL); }); row_bw("topk f32", s, ms, 4.0 * n, 0, ok);
            if (c.rows == 1) { ms = time_ms_stream([&] { kn_cuda_topk_f32(dv, di, dx, c.rows, c.V, c.k, NULL); }); row_bw("topk f32, stream", s, ms, 4.0 * n, 0, ok); } }
        /* top-p */
        for (float p : {0.5f, 0.9f, 1.0f}) {
            int32_t *dn = dnew<int32_t>(c.rows); float *dth = dnew<float>(c.rows);
            poison(dn, c.rows); poison(dth, c.rows);
            KN(kn_cuda_topp_f32(dn, dth, dx, c.rows, c.V, p, NULL));
            auto NK = down(dn, c.rows); auto TH = down(dth, c.rows);
            bool okp = true; double worst = 0;
            for (int r = 0; r < c.rows; r++) {
                const float *xr = &x[(size_t)r * c.V]; double m = -1e300, sum = 0, above = 0, atleast = 0; long cnt = 0;
                for (int i = 0; i < c.V; i++) m = std::max(m, (double)xr[i]);
                for (int i = 0; i < c.V; i++) sum += std::exp(xr[i] - m);
                for (int i = 0; i < c.V; i++) { double q = std::exp(xr[i] - m) / sum; if (xr[i] > TH[r]) above += q; if (xr[i] >= TH[r]) { atleast += q; cnt++; } }
                /* smallest set: mass strictly above the threshold is < p, mass at or above reaches p */
                bool good = above < p + 1e-5 && atleast >= p - 1e-5 && cnt == NK[r];
                worst = std::max(worst, std::max(above - p, p - atleast));
                if (!good) okp = false;
            }
            char w[64]; snprintf(w, sizeof w, " p=%.1f (margin %.2g)", p, worst);
            checkb("kn_cuda_topp_f32", s + w, okp);
            if (c.bench && p == 0.9f) { float ms = time_ms([&] { kn_cuda_topp_f32(dn, dth, dx, c.rows, c.V, p, NULL); }); row_bw("topp f32", s + " p=0.9", ms, 4.0 * n, 0, okp);
                if (c.rows == 1) { ms = time_ms_stream([&] { kn_cuda_topp_f32(dn, dth, dx, c.rows, c.V, p, NULL); }); row_bw("topp f32, stream", s + " p=0.9", ms, 4.0 * n, 0, okp); } }
            CK(cudaFree(dn)); CK(cudaFree(dth));
        }
        CK(cudaFree(dx)); CK(cudaFree(dv)); CK(cudaFree(di));
    }
}

/* ---- pool -------------------------------------------------------------------------------------- */
static void test_pool() {
    printf("[pool]\n");
    kn_cuda_pool *p = NULL;
    KN(kn_cuda_pool_new(&p, 0));
    std::vector<void *> ptrs;
    size_t sizes[] = {1, 300, 513, 4096, 1 << 20, 3 << 20, 100 << 20};
    for (int round = 0; round < 3; round++) {
        for (size_t s : sizes) { void *q = NULL; KN(kn_cuda_pool_alloc(p, s, &q)); ptrs.push_back(q); CK(cudaMemset(q, round, s)); }
        kn_cuda_pool_stats st; kn_cuda_pool_get_stats(p, &st);
        if (round == 0) printf("  after round 0: current %zu peak %zu device allocs %lld\n", st.current_bytes, st.peak_bytes, (long long)st.n_device_allocs);
        for (void *q : ptrs) KN(kn_cuda_pool_release(p, q));
        ptrs.clear();
    }
    kn_cuda_pool_stats st; kn_cuda_pool_get_stats(p, &st);
    checkb("kn_cuda_pool", "steady state: 3 rounds of 7 allocs -> 7 cudaMalloc, current 0, peak > 100MB",
           st.n_device_allocs == 7 && st.n_allocs == 21 && st.current_bytes == 0 && st.peak_bytes >= (100u << 20) && st.cached_bytes == st.peak_bytes);
    /* many small live blocks: hash growth */
    for (int i = 0; i < 5000; i++) { void *q; KN(kn_cuda_pool_alloc(p, 256 + (i % 7) * 1000, &q)); ptrs.push_back(q); }
    bool okr = true; for (void *q : ptrs) okr &= kn_cuda_pool_release(p, q) == KN_OK;
    ptrs.clear();
    checkb("kn_cuda_pool", "5000 live blocks released", okr);
    int x; kn_status s = kn_cuda_pool_release(p, &x);
    checkb("kn_cuda_pool", std::string("foreign pointer -> KN_ERR_INVALID: ") + kn_last_error(), s == KN_ERR_INVALID);
    void *big = NULL;
    s = kn_cuda_pool_alloc(p, (size_t)1 << 44, &big);
    checkb("kn_cuda_pool", std::string("16 TiB -> KN_ERR_NOMEM: ") + kn_last_error(), s == KN_ERR_NOMEM && big == NULL);
    void *q = NULL; s = kn_cuda_pool_alloc(p, 1 << 20, &q);   // still usable after OOM
    checkb("kn_cuda_pool", "alloc works after OOM", s == KN_OK && q && cudaMemset(q, 0, 1 << 20) == cudaSuccess);
    kn_cuda_pool_release(p, q);
    /* steady-state cost */
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 100000; i++) { void *r; kn_cuda_pool_alloc(p, 1 << 16, &r); kn_cuda_pool_release(p, r); }
    double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / 100000;
    printf("  alloc+release steady state: %.0f ns\n", ns);
    KN(kn_cuda_pool_trim(p));
    kn_cuda_pool_get_stats(p, &st);
    checkb("kn_cuda_pool", "trim empties the cache", st.cached_bytes == 0);
    kn_cuda_pool *lim = NULL; KN(kn_cuda_pool_new(&lim, 1 << 20));
    s = kn_cuda_pool_alloc(lim, 2 << 20, &q);
    checkb("kn_cuda_pool", std::string("limit -> KN_ERR_NOMEM: ") + kn_last_error(), s == KN_ERR_NOMEM);
    kn_cuda_pool_free(lim);
    kn_cuda_pool_free(p);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) g_quick = true;
        if (!strcmp(argv[i], "--tests")) g_tests_only = g_quick = true;
    }
    const char *only = getenv("KN_BENCH_ONLY");
    g_rng = (uint64_t)std::chrono::high_resolution_clock::now().time_since_epoch().count();
    printf("seed %llu\n", (unsigned long long)g_rng);
    cudaDeviceProp pr; CK(cudaGetDeviceProperties(&pr, 0));
    printf("device: %s, %d SMs, L2 %d MB, cc %d.%d\n", pr.name, pr.multiProcessorCount, pr.l2CacheSize >> 20, pr.major, pr.minor);
    CKB(cublasCreate(&g_blas));
    bench_copy();
    auto want = [&](const char *n) { return !only || strstr(only, n); };
    if (want("floor") && !g_tests_only) bench_floor();
    if (want("pool")) test_pool();
    if (want("gemv")) test_bench_gemv();
    if (want("softmax")) test_bench_softmax();
    if (want("norm")) test_bench_norms();
    if (want("ce")) test_bench_ce();
    if (want("adamw")) test_bench_adamw();
    if (want("rope")) test_bench_rope();
    if (want("emb")) test_bench_embedding();
    if (want("topk")) test_bench_topk();
    if (want("bf16")) test_bench_gemm_bf16();
    if (want("sgemm")) { test_sgemm(); if (!g_tests_only) bench_sgemm(); }
    printf("\n%-24s %-22s %10s %10s %-8s %7s %-6s %9s %s\n", "kernel", "size", "time_us", "rate", "unit", "ratio", "vs", "relerr", "check");
    for (auto &r : g_rows)
        printf("%-24s %-22s %10.1f %10.1f %-8s %7.3f %-6s %9.2g %s\n", r.name.c_str(), r.size.c_str(), r.us, r.rate, r.unit.c_str(), r.ratio, r.vs.c_str(), r.err, r.ok ? "ok" : "FAIL");
    printf("\n%s: %d check(s) failed\n", g_fail ? "FAILED" : "ALL PASSED", g_fail);
    cublasDestroy(g_blas);
    return g_fail ? 1 : 0;
}
