/* cpu.c: cpuid-based feature detection (see cpu.h). */
#include "core/cpu.h"
#include "core/env.h"
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <sys/utsname.h>

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

/* ---- kn_cpu_id ---- */
static char g_id[512];
static pthread_once_t g_id_once = PTHREAD_ONCE_INIT;

static void describe(void) {
    struct utsname u;
    char *p = g_id, *end = g_id + sizeof g_id;
    p += snprintf(p, (size_t)(end - p), "%s", uname(&u) == 0 ? u.machine : "unknown");
#if (defined(__x86_64__) || defined(__i386__)) && !defined(KN_NO_X86)
    unsigned a, b, c, d, r[12];
    char vendor[13];
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0), "c"(0));
    memcpy(vendor, &b, 4); memcpy(vendor + 4, &d, 4); memcpy(vendor + 8, &c, 4); vendor[12] = 0;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
    unsigned fam = (a >> 8) & 15, model = (a >> 4) & 15, step = a & 15;
    if (fam == 15) fam += (a >> 20) & 255;
    if (fam == 6 || fam >= 15) model |= ((a >> 16) & 15) << 4;
    p += snprintf(p, (size_t)(end - p), " %s %u/%u/%u", vendor, fam, model, step);
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0x80000000u), "c"(0));
    if (a >= 0x80000004u) {
        for (unsigned i = 0; i < 3; i++)
            __asm__ volatile("cpuid" : "=a"(r[4 * i]), "=b"(r[4 * i + 1]), "=c"(r[4 * i + 2]), "=d"(r[4 * i + 3]) : "a"(0x80000002u + i), "c"(0));
        char brand[49];
        memcpy(brand, r, 48); brand[48] = 0;
        char *s = brand;
        while (*s == ' ') s++;
        p += snprintf(p, (size_t)(end - p), " %s", s);
    }
    const kn_cpu_info *ci = kn_cpu();
    const struct { const char *name; int on; } f[] = {
        {"avx2", ci->avx2}, {"fma", ci->fma}, {"f16c", ci->f16c}, {"avx512f", ci->avx512f}, {"avx512bw", ci->avx512bw},
        {"avx512vl", ci->avx512vl}, {"avx512dq", ci->avx512dq}, {"avx512vnni", ci->avx512vnni},
        {"avx512bf16", ci->avx512bf16}, {"amx_bf16", ci->amx_bf16}};
    for (size_t i = 0; i < sizeof f / sizeof f[0] && p < end; i++)
        if (f[i].on) p += snprintf(p, (size_t)(end - p), " %s", f[i].name);
#else
    /* elsewhere (arm64, power): the kernel's description of the CPU */
    FILE *fp = fopen("/proc/cpuinfo", "r");
    static const char *keys[] = {"CPU implementer", "CPU part", "CPU variant", "Features", "cpu", "model name"};
    bool seen[sizeof keys / sizeof keys[0]] = {false};
    char line[1024];
    while (fp && fgets(line, sizeof line, fp))
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
            size_t kl = strlen(keys[k]);
            char *v = strchr(line, ':');
            if (seen[k] || strncmp(line, keys[k], kl) || !v || (line[kl] != ' ' && line[kl] != '\t' && line[kl] != ':')) continue;
            seen[k] = true;
            v[strcspn(v, "\n")] = 0;
            if (end - p > 1) p += snprintf(p, (size_t)(end - p), " %s", v + 1);
        }
    if (fp) fclose(fp);
#endif
    (void)p;
}

const char *kn_cpu_id(void) { pthread_once(&g_id_once, describe); return g_id; }
