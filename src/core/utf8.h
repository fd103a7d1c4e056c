/* core/utf8.h: UTF-8 checks shared by data/ and llm/ (src/core/utf8.c). */
#ifndef KN_CORE_UTF8_H
#define KN_CORE_UTF8_H
#include <stddef.h>

/* Check the character starting at s (n bytes available).
 * Returns its length (1..4) when complete and valid, 0 when s is a valid but
 * unfinished prefix (more bytes needed), or -k when invalid, where k >= 1 is
 * the number of bytes to replace by one U+FFFD (the maximal valid subpart). */
int kn__utf8_check(const unsigned char *s, size_t n);
#endif
