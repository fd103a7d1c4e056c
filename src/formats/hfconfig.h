/* hfconfig.h: a small, strict JSON reader, enough for Hugging Face config.json,
 * tokenizer_config.json and safetensors headers.
 *
 * The whole text is parsed once into a flat array of nodes (no recursion: an
 * explicit stack with a depth limit of KN_JSON_MAX_DEPTH), strings are decoded
 * (escapes, \uXXXX with surrogate pairs) into one buffer and NUL-terminated.
 * Values are addressed by node ids (int64_t; the root is 0, -1 means "none"),
 * valid until kn_json_free. Duplicate object keys are kept; kn_json_get
 * returns the first. Non-goals: writing JSON, streaming, comments, NaN.
 *
 *   kn_json *j;
 *   if (kn_json_load("config.json", &j) != KN_OK) return fail(kn_last_error());
 *   int64_t n_layers;
 *   if (!kn_json_get_i64(j, 0, "num_hidden_layers", &n_layers)) ...;
 *   for (int64_t v = kn_json_first(j, 0); v >= 0; v = kn_json_next(j, v))
 *       printf("%s\n", kn_json_key(j, v, NULL));
 *   kn_json_free(j);
 */
#ifndef KN_HFCONFIG_H
#define KN_HFCONFIG_H
#include "kiln_base.h"

#define KN_JSON_MAX_DEPTH 256

typedef enum kn_json_type {
    KN_JSON_NULL = 0, KN_JSON_BOOL, KN_JSON_NUMBER, KN_JSON_STRING, KN_JSON_ARRAY, KN_JSON_OBJECT,
} kn_json_type;

typedef struct kn_json kn_json;

/* Parse len bytes of UTF-8 JSON (need not be NUL-terminated; one value plus
 * whitespace). On error: KN_ERR_FORMAT (or KN_ERR_NOMEM / KN_ERR_LIMIT for
 * nesting deeper than KN_JSON_MAX_DEPTH), *out = NULL, and a message with the
 * byte offset. */
kn_status kn_json_parse(const char *text, size_t len, kn_json **out);
/* Read and parse a file (e.g. a Hugging Face config.json). */
kn_status kn_json_load(const char *path, kn_json **out);
void kn_json_free(kn_json *j);                         /* NULL is a no-op */

int64_t      kn_json_n_nodes(const kn_json *j);
kn_json_type kn_json_kind(const kn_json *j, int64_t v);    /* KN_JSON_NULL for -1  */
int64_t kn_json_count(const kn_json *j, int64_t v);   /* children of array/object */
int64_t kn_json_first(const kn_json *j, int64_t v);   /* first child, or -1       */
int64_t kn_json_next(const kn_json *j, int64_t v);    /* next sibling, or -1      */
/* Member name of v when v is a member of an object, else NULL. */
const char *kn_json_key(const kn_json *j, int64_t v, size_t *len);
int64_t kn_json_get(const kn_json *j, int64_t obj, const char *key); /* O(members) */
int64_t kn_json_at(const kn_json *j, int64_t arr, int64_t i);  /* i-th element or member, O(i) */

/* Typed reads; false when v is not of that type. Strings are NUL-terminated
 * (and may contain NULs from \u0000: use *len). kn_json_int accepts only
 * numbers that are exact integers within int64. */
const char *kn_json_str(const kn_json *j, int64_t v, size_t *len);
bool kn_json_num(const kn_json *j, int64_t v, double *out);
bool kn_json_int(const kn_json *j, int64_t v, int64_t *out);
bool kn_json_bool(const kn_json *j, int64_t v, bool *out);
/* True when v is a number written without fraction or exponent that fits int64
 * (JSON 2 but not 2.0 or 2e0: Python reads those as int and float). */
bool kn_json_is_int_literal(const kn_json *j, int64_t v);

/* Object member shortcuts for config files: false if absent or wrong type. */
bool kn_json_get_i64(const kn_json *j, int64_t obj, const char *key, int64_t *out);
bool kn_json_get_f64(const kn_json *j, int64_t obj, const char *key, double *out);
bool kn_json_get_bool(const kn_json *j, int64_t obj, const char *key, bool *out);
const char *kn_json_get_str(const kn_json *j, int64_t obj, const char *key);
#endif
