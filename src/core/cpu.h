/* cpu.h: run-time CPU feature detection, so one binary picks its SIMD path.
 * KN_CPU=scalar|avx2|avx512 caps the level (for testing every path on one machine). */
#ifndef KN_CPU_H
#define KN_CPU_H
typedef enum { KN_ISA_SCALAR = 0, KN_ISA_AVX2 = 1, KN_ISA_AVX512 = 2 } kn_isa;
typedef struct {
    int avx2, fma, f16c;                 /* AVX2 + FMA + F16C together make KN_ISA_AVX2 */
    int avx512f, avx512bw, avx512vl, avx512dq, avx512vnni, avx512bf16, amx_bf16;
    kn_isa isa;                          /* best usable level, after the KN_CPU cap */
} kn_cpu_info;
const kn_cpu_info *kn_cpu(void);         /* detected once, thread-safe after first call */
/* The CPU's identity for caches of code built with -march=native: vendor,
 * family/model/stepping, brand string and the feature bits above (before the
 * KN_CPU cap), e.g. "x86_64 GenuineIntel 6/85/4 Intel(R) Xeon(R) ... avx2 fma
 * f16c avx512f ...". Detected once; "<machine>" alone off x86. */
const char *kn_cpu_id(void);
#endif
