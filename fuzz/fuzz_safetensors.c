/* fuzz_safetensors.c: libFuzzer harness for the safetensors reader.
 * Accepted inputs get every tensor's bytes touched and every lookup run. */
#include "formats/safetensors.h"
#include <string.h>

static volatile uint8_t g_sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kn_safetensors *st = NULL;
    if (kn_safetensors_open_memory(data, size, &st) != KN_OK) return 0;
    for (int64_t i = 0; i < kn_safetensors_n_tensors(st); i++) {
        const kn_st_tensor *t = kn_safetensors_tensor_at(st, i);
        if (t->nbytes) g_sink ^= ((const uint8_t *)t->data)[0] ^ ((const uint8_t *)t->data)[t->nbytes - 1];
        (void)kn_safetensors_find(st, t->name);
    }
    for (int64_t i = 0; i < kn_safetensors_n_metadata(st); i++) {
        const char *k, *v;
        if (kn_safetensors_metadata_at(st, i, &k, &v)) {
            (void)kn_safetensors_metadata(st, k);
            g_sink ^= (uint8_t)(strlen(k) + strlen(v));
        }
    }
    kn_safetensors_close(st);
    return 0;
}
