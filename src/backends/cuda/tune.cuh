/* tune.cuh: KN_CUDA_TUNE="key=value,key=value" overrides a few tuning choices
 * of the hand-written kernels (rows per block, cluster sizes, loads in
 * flight), so that dev/cuda/bench.cu can time variants in one build. The
 * defaults are the measured best on an H200 (docs/PERF-cuda.md); unknown keys
 * and malformed values are ignored. Launchers read each key once per process.
 * Internal: not installed. */
#pragma once
#include <stdlib.h>
#include <string.h>

static inline int kn_cuda_tune(const char *key, int dflt) {
    const char *s = getenv("KN_CUDA_TUNE");
    size_t n = strlen(key);
    while (s && *s) {
        if (!strncmp(s, key, n) && s[n] == '=') {
            char *end;
            long v = strtol(s + n + 1, &end, 10);
            return end != s + n + 1 ? (int)v : dflt;
        }
        s = strchr(s, ',');
        if (s) s++;
    }
    return dflt;
}
