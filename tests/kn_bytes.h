/* kn_bytes.h: a tiny little-endian byte builder for tests that write file
 * images (GGUF headers and models, safetensors, ...). Header-only. */
#ifndef KN_BYTES_H
#define KN_BYTES_H
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct bb { uint8_t *p; size_t n, cap; } bb;
static inline void bb_put(bb *b, const void *s, size_t n) {
    if (b->n + n > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 256;
        while (nc < b->n + n) nc *= 2;
        b->p = realloc(b->p, nc);
        b->cap = nc;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
}
static inline void bb_u8(bb *b, uint8_t v) { bb_put(b, &v, 1); }
static inline void bb_u16(bb *b, uint16_t v) { uint8_t x[2] = {(uint8_t)v, (uint8_t)(v >> 8)}; bb_put(b, x, 2); }
static inline void bb_u32(bb *b, uint32_t v) {
    uint8_t x[4];
    for (int i = 0; i < 4; i++) x[i] = (uint8_t)(v >> (8 * i));
    bb_put(b, x, 4);
}
static inline void bb_u64(bb *b, uint64_t v) { bb_u32(b, (uint32_t)v); bb_u32(b, (uint32_t)(v >> 32)); }
static inline void bb_f32(bb *b, float f) { uint32_t u; memcpy(&u, &f, 4); bb_u32(b, u); }
/* a GGUF string: u64 length, then the bytes */
static inline void bb_strn(bb *b, const char *s, size_t n) { bb_u64(b, n); bb_put(b, s, n); }
static inline void bb_str(bb *b, const char *s) { bb_strn(b, s, strlen(s)); }
static inline void bb_pad(bb *b, size_t a) { while (b->n % a) bb_u8(b, 0); }
#endif
