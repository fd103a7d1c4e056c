/* cli_num.c: strict numeric option values (cli_num.h). */
#include "cli_num.h"
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static bool blank(const char *s) {
    while (*s && isspace((unsigned char)*s)) s++;
    return !*s;
}

bool cli_int(const char *prog, const char *opt, const char *text, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    long long v = text ? strtoll(text, &end, 10) : 0;
    if (!text || blank(text) || *end) {
        fprintf(stderr, "%s: %s expects a whole number from %" PRId64 " to %" PRId64 ", got '%s'\n", prog, opt, lo, hi, text ? text : "");
        return false;
    }
    if (errno == ERANGE || v < lo || v > hi) {
        fprintf(stderr, "%s: %s must be from %" PRId64 " to %" PRId64 ", got %s\n", prog, opt, lo, hi, text);
        return false;
    }
    *out = v;
    return true;
}

bool cli_real(const char *prog, const char *opt, const char *text, double lo, double hi, double *out) {
    char *end;
    double v = text ? strtod(text, &end) : 0;
    if (!text || blank(text) || *end || !isfinite(v)) {
        fprintf(stderr, "%s: %s expects a number from %g to %g, got '%s'\n", prog, opt, lo, hi, text ? text : "");
        return false;
    }
    if (v < lo || v > hi) {
        fprintf(stderr, "%s: %s must be from %g to %g, got %s\n", prog, opt, lo, hi, text);
        return false;
    }
    *out = v;
    return true;
}

bool cli_u64(const char *prog, const char *opt, const char *text, uint64_t *out) {
    char *end;
    errno = 0;
    const char *s = text ? text : "";
    while (isspace((unsigned char)*s)) s++;
    unsigned long long v = strtoull(s, &end, 10);
    if (!*s || *s == '-' || *s == '+' || *end || errno == ERANGE) {
        fprintf(stderr, "%s: %s expects a whole number from 0 to %" PRIu64 ", got '%s'\n", prog, opt, UINT64_MAX, text ? text : "");
        return false;
    }
    *out = v;
    return true;
}
