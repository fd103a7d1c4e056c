/* safetensors.h: read (memory-mapped) and write Hugging Face .safetensors files.
 *
 * Format: u64 LE header length N, N bytes of JSON header, then the data area.
 * The header maps each tensor name to {"dtype", "shape", "data_offsets":
 * [begin, end]} (offsets relative to the data area) and may hold a
 * "__metadata__" object of string -> string. Everything is validated at open:
 * dtype names, shapes, byte counts, offsets inside the data area, no overlap,
 * no duplicate names. Internal header (src/). Non-goals: dtypes kiln has no
 * kn_dtype for (I16, U16, U32, U64, F8_*), sharded index files.
 *
 *   kn_safetensors *st;
 *   if (kn_safetensors_open("model.safetensors", &st) != KN_OK) return fail(kn_last_error());
 *   const kn_st_tensor *t = kn_safetensors_find(st, "lm_head.weight");
 *   if (t && t->dtype == KN_BF16) use(t->data, t->shape[0], t->shape[1]);
 *   kn_safetensors_close(st);
 */
#ifndef KN_SAFETENSORS_H
#define KN_SAFETENSORS_H
#include "kiln_base.h"

#define KN_ST_MAX_DIMS 8
#define KN_ST_MAX_HEADER (100u << 20)   /* same 100 MB cap as the reference library */

typedef struct kn_st_tensor {
    const char *name;                /* NUL-terminated; lives until close          */
    size_t name_len;
    kn_dtype dtype;                  /* F32 F16 BF16 F64 I8 I32 I64 U8 BOOL        */
    int ndim;                        /* 0 (scalar) .. KN_ST_MAX_DIMS               */
    int64_t shape[KN_ST_MAX_DIMS];   /* row-major, shape[ndim-1] contiguous        */
    const void *data;                /* into the mapping; NOT necessarily aligned  */
    size_t nbytes;
} kn_st_tensor;

typedef struct kn_safetensors kn_safetensors;

kn_status kn_safetensors_open(const char *path, kn_safetensors **out);
/* Same over caller memory (not copied; must outlive the handle). */
kn_status kn_safetensors_open_memory(const void *data, size_t size, kn_safetensors **out);
void kn_safetensors_close(kn_safetensors *st);            /* NULL is a no-op */

int64_t kn_safetensors_n_tensors(const kn_safetensors *st);
const kn_st_tensor *kn_safetensors_tensor_at(const kn_safetensors *st, int64_t i); /* header order */
const kn_st_tensor *kn_safetensors_find(const kn_safetensors *st, const char *name); /* NULL if absent */
/* __metadata__: value for key or NULL; and iteration over all pairs. */
const char *kn_safetensors_metadata(const kn_safetensors *st, const char *key);
int64_t kn_safetensors_n_metadata(const kn_safetensors *st);
bool kn_safetensors_metadata_at(const kn_safetensors *st, int64_t i, const char **key, const char **value);
/* "F32", "BF16", ... for a dtype safetensors can hold; NULL otherwise. */
const char *kn_safetensors_dtype_str(kn_dtype t);

/* Write n tensors to `path` (atomically: to path.tmp, then renamed). Tensor i
 * is names[i] (unique, non-empty, not "__metadata__"), dtypes[i] (a dtype
 * kn_safetensors_dtype_str accepts), ndims[i] (0..8) dims shapes[i][0..ndim)
 * (>= 0) and its row-major bytes at datas[i] (may be NULL when empty).
 * meta_kv holds n_meta (key, value) string pairs: meta_kv[2k], meta_kv[2k+1].
 * The header lists tensors in the given order and is padded with spaces to a
 * multiple of 8 bytes, as the reference writer does; the data is contiguous,
 * 8-byte dtypes first, then 4-, 2- and 1-byte ones (each group in the given
 * order), so every tensor is aligned to its element size in the file. */
kn_status kn_safetensors_write(const char *path, int64_t n, const char *const names[],
                               const kn_dtype dtypes[], const int ndims[],
                               const int64_t shapes[][KN_ST_MAX_DIMS], const void *const datas[],
                               int64_t n_meta, const char *const meta_kv[]);
#endif
