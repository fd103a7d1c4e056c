/* gguf_write.h: a GGUF v3 writer (the format gguf.h reads and llama.cpp
 * loads): metadata key/values and f32 tensors, written to a file (through a
 * temporary file that is renamed over the target, so a failed write never
 * leaves a half file under the final name) or to memory.
 *
 *   kn_gguf_writer *w;
 *   kn_gguf_writer_new(&w);
 *   kn_gguf_w_str(w, "general.architecture", "gpt2");
 *   kn_gguf_w_u32(w, "gpt2.block_count", 4);
 *   kn_gguf_w_tensor_f32(w, "token_embd.weight", 2, (int64_t[]){C, V}, data);  // ne[0] innermost
 *   kn_status st = kn_gguf_write_file(w, "model.gguf");
 *   kn_gguf_writer_free(w);
 *
 * Metadata values are copied when added; tensor data is referenced and must
 * stay valid until the write. Every add records the first error (out of
 * memory, a duplicate key or tensor name); the write returns it. Data is
 * aligned to 32 bytes (general.alignment's default). Internal header (src/).
 */
#ifndef KN_GGUF_WRITE_H
#define KN_GGUF_WRITE_H
#include "kiln_base.h"

typedef struct kn_gguf_writer kn_gguf_writer;
struct kn_gguf;                 /* gguf.h */

kn_status kn_gguf_writer_new(kn_gguf_writer **out);
void kn_gguf_writer_free(kn_gguf_writer *w);              /* NULL is a no-op */

void kn_gguf_w_str(kn_gguf_writer *w, const char *key, const char *value);
void kn_gguf_w_u32(kn_gguf_writer *w, const char *key, uint32_t value);
void kn_gguf_w_f32(kn_gguf_writer *w, const char *key, float value);
void kn_gguf_w_bool(kn_gguf_writer *w, const char *key, bool value);
/* String array of n entries: strs[i] with lens[i] bytes (not NUL-terminated). */
void kn_gguf_w_arr_str(kn_gguf_writer *w, const char *key, uint64_t n, const char *const strs[], const size_t lens[]);
void kn_gguf_w_arr_i32(kn_gguf_writer *w, const char *key, uint64_t n, const int32_t *values);
/* A numeric array (elem_type not STRING/ARRAY) of n elements, data holding
 * their little-endian bytes back to back (may be unaligned). */
void kn_gguf_w_arr(kn_gguf_writer *w, const char *key, int elem_type, uint64_t n, const void *data);
/* Key/value i of an open GGUF file g (struct kn_gguf, gguf.h), copied with
 * its type: what `kiln quantize` keeps of its input. */
void kn_gguf_w_copy_kv(kn_gguf_writer *w, const struct kn_gguf *g, int64_t i);
/* An f32 tensor with n_dims (1..4) sizes ne (ne[0] innermost, GGML order). */
void kn_gguf_w_tensor_f32(kn_gguf_writer *w, const char *name, int n_dims, const int64_t ne[], const float *data);
/* Any tensor type kiln reads from GGUF except integers (F32, F16, BF16, Q4_0,
 * Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K): data holds its bytes as the file
 * stores them (kn_dtype_nbytes(type, numel)); ne[0] a multiple of the block. */
void kn_gguf_w_tensor(kn_gguf_writer *w, const char *name, kn_dtype type, int n_dims, const int64_t ne[], const void *data);

/* The first error of the adds so far (KN_OK if none). */
kn_status kn_gguf_writer_status(const kn_gguf_writer *w);
/* Write path.tmp, then rename it to path; every write, the flush and the
 * close are checked and a failure names the system's reason (e.g. "No space
 * left on device"); the temporary file is removed on failure. */
kn_status kn_gguf_write_file(kn_gguf_writer *w, const char *path);
/* The whole file in a malloc'd buffer (caller frees). */
kn_status kn_gguf_write_memory(kn_gguf_writer *w, void **data, size_t *size);
#endif
