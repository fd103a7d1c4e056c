/* fuzz_llama2c.c: libFuzzer harness for the two headered checkpoint readers:
 * llama2.c (legacy, v1, v2) and llm.c GPT-2. The input is copied into a
 * 4-byte aligned buffer (both readers hand out float pointers); every weight
 * of an accepted file is touched at its first and last byte. */
#include "formats/llama2c.h"
#include "formats/llmc_gpt2.h"
#include <stdlib.h>
#include <string.h>

static volatile uint8_t g_sink;

static void touch(const void *p, size_t n) {
    if (p && n) g_sink ^= ((const uint8_t *)p)[0] ^ ((const uint8_t *)p)[n - 1];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint32_t *buf = malloc(size / 4 + 1 > 0 ? (size / 4 + 1) * 4 : 4);
    if (!buf) return 0;
    memcpy(buf, data, size);
    kn_llama2c *m = NULL;
    if (kn_llama2c_open_memory(buf, size, &m) == KN_OK) {
        const kn_llama2c_config *c = kn_llama2c_config_of(m);
        for (int id = 0; id < KN_L2C_COUNT; id++) {
            const kn_llama2c_weight *w = kn_llama2c_weight_of(m, (kn_llama2c_wid)id);
            for (int l = 0; l < w->n_layers; l++) {
                const float *sc;
                touch(kn_llama2c_layer(m, (kn_llama2c_wid)id, l, &sc), w->nbytes);
                if (sc) touch(sc, (size_t)(w->rows * w->cols / c->group_size) * 4);
            }
        }
        kn_llama2c_close(m);
    }
    kn_llmc_gpt2 *g = NULL;
    if (kn_llmc_gpt2_open_memory(buf, size, &g) == KN_OK) {
        for (int i = 0; i < KN_GPT2_NPARAMS; i++) {
            const kn_llmc_gpt2_tensor *t = kn_llmc_gpt2_param(g, (kn_gpt2_param)i);
            touch(t->data, t->nbytes);
        }
        kn_llmc_gpt2_close(g);
    }
    free(buf);
    return 0;
}
