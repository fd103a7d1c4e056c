/* fuzz_gguf.c: libFuzzer harness for the GGUF reader (src/formats/gguf.c).
 * Opens the input as a GGUF image; when it is accepted, walks every accessor
 * and touches every tensor's first and last byte, so an accepted-but-wrong
 * bound shows up as an ASan report. Build: see fuzz/run.sh. */
#include "formats/gguf.h"
#include <stdio.h>
#include <string.h>

static volatile uint8_t g_sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kn_gguf *g = NULL;
    if (kn_gguf_open_memory(data, size, &g) != KN_OK) return 0;
    for (int64_t i = 0; i < kn_gguf_n_kv(g); i++) {
        kn_gguf_str k = kn_gguf_key(g, i);
        char key[256];
        size_t n = k.len < sizeof key - 1 ? (size_t)k.len : sizeof key - 1;
        memcpy(key, k.ptr, n);
        key[n] = 0;
        int64_t i64; uint64_t u64; double f64; bool b; kn_gguf_str s;
        (void)kn_gguf_kv_type(g, i);
        (void)kn_gguf_find_key(g, key);
        (void)kn_gguf_get_i64(g, key, &i64);
        (void)kn_gguf_get_u64(g, key, &u64);
        (void)kn_gguf_get_f64(g, key, &f64);
        (void)kn_gguf_get_bool(g, key, &b);
        if (kn_gguf_get_str(g, key, &s) && s.len) g_sink ^= (uint8_t)s.ptr[s.len - 1];
        kn_gguf_type et; uint64_t cnt; const void *d;
        if (kn_gguf_get_arr(g, key, &et, &cnt, &d)) {
            if (et == KN_GGUF_STRING)
                for (uint64_t j = 0; j < cnt; j++) {
                    kn_gguf_str e = kn_gguf_arr_str(g, key, j);
                    if (e.len) g_sink ^= (uint8_t)e.ptr[e.len - 1];
                }
            else if (d && cnt) g_sink ^= ((const uint8_t *)d)[0];
        }
    }
    for (int64_t i = 0; i < kn_gguf_n_tensors(g); i++) {
        const kn_gguf_tensor *t = kn_gguf_tensor_at(g, i);
        if (t->nbytes) g_sink ^= ((const uint8_t *)t->data)[0] ^ ((const uint8_t *)t->data)[t->nbytes - 1];
        char name[256];
        size_t n = t->name.len < sizeof name - 1 ? (size_t)t->name.len : sizeof name - 1;
        memcpy(name, t->name.ptr, n);
        name[n] = 0;
        (void)kn_gguf_find_tensor(g, name);
    }
    static FILE *devnull;
    if (!devnull) devnull = fopen("/dev/null", "w");
    if (devnull) kn_gguf_print(g, devnull);
    kn_gguf_close(g);
    return 0;
}
