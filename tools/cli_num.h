/* cli_num.h: strict parsing of numeric option values for the kiln program.
 *
 * Each parser takes the option's name (for the message) and its text, and
 * accepts only a complete number inside [lo, hi]: no trailing characters,
 * no empty text, no nan/inf, no silent wrap-around. On a bad value it
 * prints one line on stderr that names the option, the accepted range and
 * what was given, and returns false; the caller then exits with status 2.
 */
#ifndef KN_TOOLS_CLI_NUM_H
#define KN_TOOLS_CLI_NUM_H

#include <stdbool.h>
#include <stdint.h>

/* prog: "kiln" or "kiln train" (the message prefix) */
bool cli_int(const char *prog, const char *opt, const char *text, int64_t lo, int64_t hi, int64_t *out);
bool cli_real(const char *prog, const char *opt, const char *text, double lo, double hi, double *out);
/* any value 0 .. 2^64-1 (seeds) */
bool cli_u64(const char *prog, const char *opt, const char *text, uint64_t *out);

#endif
