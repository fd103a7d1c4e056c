/* emu_gen.c: checks the CUDA renderer's unrolled elementwise kernels
 * (kernel search, src/compile/search.c) on a machine without a GPU.
 *
 * For a few fused graphs (f32 chain with broadcast, bf16 with a transposed
 * operand, symbolic rows, f64, f16) it renders each elementwise kernel in
 * CUDA with unroll 1, 2, 4, 8 and writes, per variant, a C++ program: a shim
 * that makes the CUDA source plain C++ (blockIdx, threadIdx, ... as globals;
 * __float_as_uint by memcpy), the source, and a main that runs the kernel
 * over an emulated grid (3 blocks x 64 threads, so every thread makes many
 * grid-stride steps) at two symbol values and prints a checksum of every
 * buffer (outputs start each pass as 0xab bytes, so a stray or missing
 * write shows).
 * dev/beam/emu_check.sh compiles them with g++ and compares unroll U with
 * unroll 1: the outputs must be the same bits. Elementwise kernels need no
 * barrier or shuffle, so running the threads one after another is exact.
 *
 *   make -j2 lib && sh dev/beam/emu_check.sh
 */
#include "runtime/runtime.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kn_tensor *data(kn_ctx *ctx, kn_dtype dt, int nd, const int64_t *shape) {
    kn_tensor *t = kn_input(ctx, KN_F32, nd, shape);
    return dt == KN_F32 ? t : kn_cast(ctx, t, dt);
}
static kn_tensor *g_chain(kn_ctx *ctx) {
    kn_tensor *x = data(ctx, KN_F32, 2, (int64_t[]){37, 129}), *w = data(ctx, KN_F32, 1, (int64_t[]){129});
    return kn_add(ctx, kn_unary(ctx, KN_OP_GELU, kn_add(ctx, kn_mul(ctx, x, w), w)), x);
}
static kn_tensor *g_bf16(kn_ctx *ctx) {
    kn_tensor *a = data(ctx, KN_BF16, 2, (int64_t[]){50, 12});
    kn_tensor *t = kn_permute(ctx, data(ctx, KN_BF16, 2, (int64_t[]){12, 50}), (int[]){1, 0});
    return kn_cast(ctx, kn_mul_scalar(ctx, kn_unary(ctx, KN_OP_TANH, kn_add(ctx, a, t)), 0.5), KN_BF16);
}
static kn_tensor *g_sym(kn_ctx *ctx) {
    int T = kn_sym_new(ctx, "T", 77);
    kn_tensor *g = kn_slice_sym(ctx, data(ctx, KN_F32, 2, (int64_t[]){77, 150}), 0, 0, T);
    kn_tensor *u = kn_slice_sym(ctx, data(ctx, KN_F32, 2, (int64_t[]){77, 150}), 0, 0, T);
    return kn_mul(ctx, kn_unary(ctx, KN_OP_SILU, g), u);
}
static kn_tensor *g_f64(kn_ctx *ctx) {
    kn_tensor *x = data(ctx, KN_F64, 3, (int64_t[]){3, 7, 19});
    return kn_unary(ctx, KN_OP_SQRT, kn_add(ctx, kn_mul(ctx, x, x), x));
}
static kn_tensor *g_f16(kn_ctx *ctx) {
    kn_tensor *x = data(ctx, KN_F16, 1, (int64_t[]){1001});
    return kn_cast(ctx, kn_unary(ctx, KN_OP_EXP, kn_mul_scalar(ctx, x, 0.25)), KN_F16);
}

static const char shim[] =
    "#include <cmath>\n#include <cstdio>\n#include <cstdlib>\n#include <cstring>\n"
    "using std::isnan;\n"
    "struct emu_dim3 { unsigned x; };\n"
    "static emu_dim3 blockIdx, threadIdx, blockDim, gridDim;\n"
    "#define __global__\n#define __device__\n#define __forceinline__ inline\n"
    "static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }\n"
    "static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }\n"
    "static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }\n";

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "/tmp/kn_emu";
    typedef kn_tensor *(*gfn)(kn_ctx *);
    static const gfn graphs[] = {g_chain, g_bf16, g_sym, g_f64, g_f16};
    char *src = malloc(1 << 16), path[512];
    int made = 0;
    for (size_t gi = 0; gi < sizeof graphs / sizeof graphs[0]; gi++) {
        kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){.backend = kn_backend_cpu()});
        kn_tensor *out = graphs[gi](ctx), **order = NULL;
        kn_fgroup *groups = NULL;
        int n = 0, ng = 0;
        if (!out || kn__toposort(ctx, 1, &out, false, &order, &n) != KN_OK ||
            !kn__fuse(order, n, ctx->n_all, 1, &out, NULL, &groups, &ng)) { fprintf(stderr, "graph %zu: %s\n", gi, kn_last_error()); return 1; }
        for (int q = 0; q < ng; q++) {
            if (groups[q].k.red != KN_OP_NONE) continue;
            for (int u = 1; u <= 8; u *= 2) {
                kn_kernel k = groups[q].k;
                k.tune.unroll = u;
                if (kn__render("cuda", &k, src, 1 << 16) <= 0) { fprintf(stderr, "render failed\n"); return 1; }
                snprintf(path, sizeof path, "%s/g%zu_%d_u%d.cpp", dir, gi, q, u);
                FILE *f = fopen(path, "w");
                if (!f) { perror(path); return 1; }
                fputs(shim, f);
                fputs(src, f);
                /* main: buffers over the extents at the maxima (negative strides below element 0) */
                fprintf(f, "int main(void) {\n    kn_kargs a; memset(&a, 0, sizeof a);\n    static kn_i64 syms[%d];\n", KN_MAX_SYMS + 1);
                fprintf(f, "    unsigned char *mem[%d]; size_t bytes[%d];\n", k.nbuf, k.nbuf);
                for (int bi = 0; bi < k.nbuf; bi++) {
                    int64_t lo = 0, hi = 0;
                    for (int d = 0; d < k.ndim; d++) {
                        int64_t s = (k.ext[d] - 1) * k.buf[bi].st[d];
                        if (s < 0) lo += s; else hi += s;
                    }
                    int es = (int)kn_dtype_get(k.buf[bi].dt)->type_size;
                    fprintf(f, "    bytes[%d] = %lld; mem[%d] = (unsigned char *)malloc(bytes[%d]); a.buf[%d] = (char *)mem[%d] + %lld;\n",
                            bi, (long long)((hi - lo + 1) * es), bi, bi, bi, bi, (long long)(-lo * es));
                    fprintf(f, "    for (size_t i = 0; i < bytes[%d] / %d; i++) {\n", bi, es);
                    if (k.buf[bi].out) fprintf(f, "        memset(mem[%d] + i * %d, 0xab, %d);\n", bi, es, es);
                    else if (k.buf[bi].dt == KN_F32) fprintf(f, "        float v = (float)((i * 37 + %d) %% 101) / 25.0f - 2.0f; memcpy(mem[%d] + i * 4, &v, 4);\n", bi, bi);
                    else if (k.buf[bi].dt == KN_F64) fprintf(f, "        double v = (double)((i * 37 + %d) %% 101) / 25.0 - 2.0; memcpy(mem[%d] + i * 8, &v, 8);\n", bi, bi);
                    else if (k.buf[bi].dt == KN_BF16) fprintf(f, "        float v = (float)((i * 37 + %d) %% 101) / 25.0f - 2.0f; unsigned w; memcpy(&w, &v, 4); unsigned short h = (unsigned short)(w >> 16); memcpy(mem[%d] + i * 2, &h, 2);\n", bi, bi);
                    else fprintf(f, "        unsigned short h = (unsigned short)(0x3400 + (i * 37 + %d) %% 0x1000); memcpy(mem[%d] + i * 2, &h, 2);\n", bi, bi);
                    fprintf(f, "    }\n");
                }
                for (int d = 0; d < k.ndim; d++)
                    if (k.sym[d]) fprintf(f, "    syms[%d] = %lld;\n", k.sym[d], (long long)(k.ext[d] / k.mul[d]));
                fprintf(f, "    a.syms = syms;\n    gridDim.x = 3; blockDim.x = 64;\n");
                fprintf(f, "    for (int pass = 0; pass < 2; pass++) {\n");
                fprintf(f, "        if (pass) for (int s = 1; s < %d; s++) if (syms[s] > 3) syms[s] -= 3;\n", KN_MAX_SYMS + 1);
                for (int bi = 0; bi < k.nbuf; bi++)   /* outputs start as the sentinel in each pass */
                    if (k.buf[bi].out) fprintf(f, "        memset(mem[%d], 0xab, bytes[%d]);\n", bi, bi);
                fprintf(f, "        for (blockIdx.x = 0; blockIdx.x < gridDim.x; blockIdx.x++)\n"
                           "            for (threadIdx.x = 0; threadIdx.x < blockDim.x; threadIdx.x++) %s(a);\n", k.name);
                fprintf(f, "        for (int b = 0; b < %d; b++) { unsigned long long h = 1469598103934665603ull;\n"
                           "            for (size_t i = 0; i < bytes[b]; i++) { h ^= mem[b][i]; h *= 1099511628211ull; }\n"
                           "            printf(\"pass %%d buf %%d %%016llx\\n\", pass, b, h); }\n    }\n    return 0;\n}\n", k.nbuf);
                fclose(f);
                made++;
            }
        }
        free(groups);
        free(order);
        kn_ctx_free(ctx);
    }
    free(src);
    printf("%d programs in %s\n", made, dir);
    return 0;
}
