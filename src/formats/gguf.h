/* gguf.h: read-only GGUF v2/v3 reader over a memory-mapped file (or a memory
 * block, for fuzzing). Everything is validated at open: counts, string
 * lengths, value types, tensor dims/types/offsets against the file size,
 * duplicate names. After a successful open every accessor is safe.
 *
 * Internal header (src/), used by the model loader, the tokenizers and
 * `kiln info`. Strings returned point into the mapping (NOT NUL-terminated);
 * they live until kn_gguf_close.
 */
#ifndef KN_GGUF_H
#define KN_GGUF_H
#include "kiln_base.h"

typedef enum kn_gguf_type {       /* on-disk value type ids (GGUF spec)       */
    KN_GGUF_U8 = 0, KN_GGUF_I8 = 1, KN_GGUF_U16 = 2, KN_GGUF_I16 = 3,
    KN_GGUF_U32 = 4, KN_GGUF_I32 = 5, KN_GGUF_F32 = 6, KN_GGUF_BOOL = 7,
    KN_GGUF_STRING = 8, KN_GGUF_ARRAY = 9, KN_GGUF_U64 = 10, KN_GGUF_I64 = 11,
    KN_GGUF_F64 = 12,
} kn_gguf_type;

typedef struct kn_gguf_str { const char *ptr; uint64_t len; } kn_gguf_str;

typedef struct kn_gguf_tensor {
    kn_gguf_str name;
    int n_dims;                  /* 1..4 (GGML_MAX_DIMS)                          */
    int64_t ne[4];               /* ne[0] is the innermost (contiguous) dimension */
    kn_dtype type;               /* mapped from the GGML type id                   */
    uint32_t ggml_type;          /* raw on-disk type id                            */
    uint64_t offset;             /* relative to the data section                   */
    size_t nbytes;
    const void *data;            /* points into the mapping                        */
} kn_gguf_tensor;

typedef struct kn_gguf kn_gguf;

/* Open and validate. On failure returns a status, *out = NULL, and a message
 * in kn_last_error() naming the problem (and the offset where it applies). */
kn_status kn_gguf_open(const char *path, kn_gguf **out);
/* Same over caller memory (not copied; must outlive the handle). */
kn_status kn_gguf_open_memory(const void *data, size_t size, kn_gguf **out);
void kn_gguf_close(kn_gguf *g);                       /* NULL is a no-op */

uint32_t kn_gguf_version(const kn_gguf *g);
size_t   kn_gguf_alignment(const kn_gguf *g);
/* File offset where the tensor data section starts (tensor offsets are
 * relative to it). With 0 tensors it may lie past the end of the file. */
uint64_t kn_gguf_data_offset(const kn_gguf *g);

/* Metadata: keys are found by exact name; index -1 = absent. */
int64_t kn_gguf_n_kv(const kn_gguf *g);
int64_t kn_gguf_find_key(const kn_gguf *g, const char *key);
kn_gguf_str  kn_gguf_key(const kn_gguf *g, int64_t i);
kn_gguf_type kn_gguf_kv_type(const kn_gguf *g, int64_t i);
/* Scalars: any integer/bool type converts to int64 / uint64, any numeric to
 * double. Return false if the value is absent or not of a compatible type. */
bool kn_gguf_get_i64(const kn_gguf *g, const char *key, int64_t *v);
bool kn_gguf_get_u64(const kn_gguf *g, const char *key, uint64_t *v);
bool kn_gguf_get_f64(const kn_gguf *g, const char *key, double *v);
bool kn_gguf_get_bool(const kn_gguf *g, const char *key, bool *v);
bool kn_gguf_get_str(const kn_gguf *g, const char *key, kn_gguf_str *v);
/* Arrays: element type, count, raw element pointer for numeric arrays (NULL
 * for string arrays; may be unaligned, read with memcpy), i-th string. */
bool kn_gguf_get_arr(const kn_gguf *g, const char *key, kn_gguf_type *elem_type,
                     uint64_t *n, const void **data);
kn_gguf_str kn_gguf_arr_str(const kn_gguf *g, const char *key, uint64_t i);

/* Tensors */
int64_t kn_gguf_n_tensors(const kn_gguf *g);
const kn_gguf_tensor *kn_gguf_tensor_at(const kn_gguf *g, int64_t i);
const kn_gguf_tensor *kn_gguf_find_tensor(const kn_gguf *g, const char *name);

/* Human-readable dump for `kiln info`: version, every key with its value
 * (long arrays abbreviated), every tensor with type, shape and bytes. */
void kn_gguf_print(const kn_gguf *g, void *FILE_ptr);
#endif
