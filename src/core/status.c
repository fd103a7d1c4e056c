/* status.c: status names and the per-thread last-error message. */
#include "kiln_base.h"
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char g_msg[1024];

const char *kn_status_str(kn_status s) {
    switch (s) {
    case KN_OK: return "ok";
    case KN_ERR_INVALID: return "invalid argument";
    case KN_ERR_NOMEM: return "out of memory";
    case KN_ERR_IO: return "i/o error";
    case KN_ERR_FORMAT: return "bad file format";
    case KN_ERR_UNSUPPORTED: return "unsupported";
    case KN_ERR_STATE: return "invalid state";
    case KN_ERR_BACKEND: return "backend error";
    case KN_ERR_LIMIT: return "limit exceeded";
    }
    return "unknown status";
}

const char *kn_last_error(void) { return g_msg; }
void kn_clear_error(void) { g_msg[0] = 0; }

kn_status kn_set_error(kn_status s, const char *fmt, ...) {
    /* format into a local buffer first: messages often quote the previous
     * one (kn_last_error() as an argument), which lives in g_msg itself */
    char buf[sizeof g_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    memcpy(g_msg, buf, sizeof buf);
    return s;
}
