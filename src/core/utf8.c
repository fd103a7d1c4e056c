/* utf8.c: UTF-8 validation, in core because both the text loaders (data/)
 * and the tokenizers (llm/) need it and data/ sits below llm/. */
#include "core/utf8.h"
#include "kiln_tokenizer.h"   /* declares: kn_utf8_valid_prefix (public) */

/* Check the character starting at s (n bytes available).
 * Returns its length (1..4) when complete and valid, 0 when s is a valid but
 * unfinished prefix (more bytes needed), or -k when invalid, where k >= 1 is
 * the number of bytes to replace by one U+FFFD (the maximal valid subpart). */
int kn__utf8_check(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    int need; unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) { need = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
    else if (c >= 0xF0 && c <= 0xF4) { need = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
    else return -1;
    for (int i = 1; i < need; i++) {
        if ((size_t)i >= n) return 0;
        unsigned b = s[i];
        if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return -i;
    }
    return need;
}

size_t kn_utf8_valid_prefix(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        int k = kn__utf8_check(u + i, n - i);
        if (k <= 0) return i;
        i += (size_t)k;
    }
    return n;
}
