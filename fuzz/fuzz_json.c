/* fuzz_json.c: libFuzzer harness for the JSON reader (src/formats/hfconfig.c).
 * Accepted documents are walked completely with an explicit stack (no
 * recursion), reading every string, number and key. */
#include "formats/hfconfig.h"
#include <stdlib.h>
#include <string.h>

static volatile size_t g_sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kn_json *j = NULL;
    if (kn_json_parse((const char *)data, size, &j) != KN_OK) return 0;
    int64_t n = kn_json_n_nodes(j);
    /* nodes are numbered in document order: visit them all directly */
    for (int64_t v = 0; v < n; v++) {
        size_t len;
        const char *k = kn_json_key(j, v, &len);
        if (k) g_sink += len + (size_t)(unsigned char)k[len];   /* k[len] is the NUL */
        const char *s = kn_json_str(j, v, &len);
        if (s) g_sink += len + (size_t)(unsigned char)s[len];
        double d; int64_t i; bool b;
        if (kn_json_num(j, v, &d)) g_sink += d > 0;
        if (kn_json_int(j, v, &i)) g_sink += (size_t)i;
        if (kn_json_bool(j, v, &b)) g_sink += b;
        int64_t cnt = 0;
        for (int64_t c = kn_json_first(j, v); c >= 0; c = kn_json_next(j, c)) cnt++;
        if (cnt != kn_json_count(j, v)) abort();   /* child links must match the count */
        if (cnt) (void)kn_json_at(j, v, cnt - 1);
    }
    if (kn_json_kind(j, 0) == KN_JSON_OBJECT) {
        (void)kn_json_get(j, 0, "hidden_size");
        (void)kn_json_get_str(j, 0, "model_type");
    }
    kn_json_free(j);
    return 0;
}
