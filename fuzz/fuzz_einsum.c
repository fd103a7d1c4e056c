/* fuzz_einsum.c: libFuzzer harness for kn_einsum's spec parser and shape
 * checks (src/graph/ops_einsum.c). Input: byte 0 picks 1..4 operands, then
 * per operand one byte of rank (0..5) and one byte per dim of size (1..3),
 * the rest is the spec (NUL-terminated here). Every input must either give
 * a tensor (run on the reference backend when small, and its values checked
 * finite: the operands are all ones) or NULL with an "einsum" message; no
 * crash, no leak, no hang. */
#include "kiln.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    size_t p = 0;
    int n = 1 + data[p++] % 4;
    kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){kn_backend_ref()});
    if (!ctx) return 0;
    kn_tensor *ops[4];
    for (int i = 0; i < n; i++) {
        int nd = p < size ? data[p++] % 6 : 1;
        int64_t sh[8];
        for (int d = 0; d < nd; d++) sh[d] = p < size ? 1 + data[p++] % 3 : 2;
        ops[i] = kn_ones(ctx, KN_F32, nd, sh);
    }
    char *spec = malloc(size - p + 1);
    if (!spec) { kn_ctx_free(ctx); return 0; }
    memcpy(spec, data + p, size - p);
    spec[size - p] = 0;
    kn_tensor *y = kn_einsum(ctx, spec, n, ops);
    if (!y) {
        if (!strstr(kn_last_error(), "einsum")) abort();   /* every refusal names the op */
    } else if (kn_numel(y) <= 4096) {
        float *v = malloc(sizeof(float) * (size_t)(kn_numel(y) ? kn_numel(y) : 1));
        if (v && kn_tensor_read(y, v, KN_F32) == KN_OK)
            for (int64_t i = 0; i < kn_numel(y); i++)
                if (!(v[i] >= 1)) abort();                 /* sums of products of ones */
        free(v);
    }
    free(spec);
    kn_ctx_free(ctx);
    return 0;
}
