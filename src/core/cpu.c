/* cpu.c: cpuid-based feature detection (see cpu.h). */
#include "core/cpu.h"
#include "core/env.h"
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

static kn_cpu_info g_info;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void detect(void) {
    kn_cpu_info *c = &g_info;
#if (defined(__x86_64__) || defined(__i386__)) && !defined(KN_NO_X86)
    __builtin_cpu_init();
    c->avx2 = __builtin_cpu_supports("avx2");
    c->fma = __builtin_cpu_supports("fma");
    c->f16c = 1; /* every AVX2 CPU has F16C; checked below through cpuid to be sure */
    unsigned a, b, cx, d;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(cx), "=d"(d) : "a"(1), "c"(0));
    c->f16c = (cx >> 29) & 1;
    int osxsave = (cx >> 27) & 1;
    unsigned xcr0 = 0;
    if (osxsave) { unsigned lo, hi; __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0)); xcr0 = lo; }
    int os_avx512 = (xcr0 & 0xe6) == 0xe6;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(cx), "=d"(d) : "a"(7), "c"(0));
    c->avx512f = os_avx512 && ((b >> 16) & 1);
    c->avx512dq = os_avx512 && ((b >> 17) & 1);
    c->avx512bw = os_avx512 && ((b >> 30) & 1);
    c->avx512vl = os_avx512 && ((b >> 31) & 1);
    c->avx512vnni = os_avx512 && ((cx >> 11) & 1);
    c->amx_bf16 = (d >> 22) & 1;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(cx), "=d"(d) : "a"(7), "c"(1));
    c->avx512bf16 = os_avx512 && ((a >> 5) & 1);
#endif
    c->isa = KN_ISA_SCALAR;
    if (c->avx2 && c->fma && c->f16c) c->isa = KN_ISA_AVX2;
#ifndef KN_NO_AVX512
    if (c->isa == KN_ISA_AVX2 && c->avx512f && c->avx512bw && c->avx512vl && c->avx512dq)
        c->isa = KN_ISA_AVX512;
#endif
    const char *cap = kn_env_get()->cpu;
    if (cap) {
        kn_isa m = !strcmp(cap, "scalar") ? KN_ISA_SCALAR : !strcmp(cap, "avx2") ? KN_ISA_AVX2 : KN_ISA_AVX512;
        if (m < c->isa) c->isa = m;
    }
}

const kn_cpu_info *kn_cpu(void) { pthread_once(&g_once, detect); return &g_info; }
