/* kiln_data.h: training data: datasets, a batching/shuffling loader with a
 * background prefetch thread, and readers for MNIST (idx), raw text (byte or
 * character level) and llm.c token shards (GPT-2 BPE, uint16).
 *
 * A dataset is n samples of up to KN_DATA_MAX_FIELDS fields ("x", "y", ...);
 * each field has a plain dtype and a per-sample shape. A dataset either owns
 * (or borrows) flat arrays, one per field, sample-major, or produces sample i
 * through a callback (e.g. token windows). A loader cuts an epoch into
 * batches of batch_size samples, in order or in a shuffled order that is a
 * pure function of (seed, epoch): Fisher-Yates driven by Philox4x32-10, so it
 * is the same on every machine, thread count and with or without prefetch.
 *
 *   kn_mnist *m;
 *   if (kn_mnist_load("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", &m))
 *       return fail(kn_last_error());
 *   kn_dataset *ds; kn_mnist_dataset(m, true, &ds);          // x: f32 [28,28] in [0,1], y: i32
 *   kn_loader_opts o = kn_loader_defaults();
 *   o.batch_size = 64; o.shuffle = true; o.seed = 1; o.prefetch = true;
 *   kn_loader *ld; kn_loader_new(ds, &o, &ld);
 *   kn_batch b;
 *   for (;;) {
 *       if (kn_loader_next(ld, &b)) return fail(kn_last_error());
 *       if (b.size == 0) break;                               // end of epoch (next call: epoch+1)
 *       kn_batch_write(&b, 0, x_input); kn_batch_write(&b, 1, y_input);
 *       kn_plan_run(step);
 *   }
 *   kn_loader_free(ld); kn_dataset_free(ds); kn_mnist_free(m);
 *
 * Ownership: every kn_*_new/load result is freed with its kn_*_free (NULL is
 * a no-op). A dataset must outlive the loaders made from it; a borrowed
 * array must outlive the dataset. Batch data stays valid until the next
 * kn_loader_next/seek/free on that loader.
 *
 * Threads: the loader's own prefetch thread calls the dataset's get function;
 * nothing else in here is thread-safe on one object.
 *
 * Non-goals: multi-process loading, random augmentation, on-the-fly
 * tokenization while training (tokenize to shards once, then read shards).
 */
#ifndef KILN_DATA_H
#define KILN_DATA_H
#pragma GCC visibility push(default)   /* what libkiln.so exports: the kn_ API (the rest is built -fvisibility=hidden) */
#include "kiln_base.h"

#ifdef __cplusplus
extern "C" {
#endif

struct kn_tensor;
struct kn_tokenizer;

#define KN_DATA_MAX_FIELDS 8
#define KN_DATA_MAX_DIMS 7

/* ---- datasets ------------------------------------------------------------- */
typedef struct kn_data_field {
    const char *name;                 /* copied by the dataset                   */
    kn_dtype dtype;                   /* plain (not quantized)                   */
    int ndim;                         /* per-sample dims, 0..KN_DATA_MAX_DIMS    */
    int64_t shape[KN_DATA_MAX_DIMS];  /* per-sample shape, row-major             */
} kn_data_field;

typedef struct kn_dataset kn_dataset;

/* Writes sample `index` (0 <= index < n): field f goes to dst[f], which holds
 * one sample of that field (row-major, the field's dtype). Returns KN_OK, or
 * a status after kn_set_error. With prefetch it runs on the loader's thread
 * (one call at a time); the loader hands its status and message over to the
 * thread that calls kn_loader_next. */
typedef kn_status (*kn_dataset_get_fn)(void *ud, int64_t index, void *const dst[]);

/* Callback dataset of n samples. free_ud (may be NULL) is called on ud by
 * kn_dataset_free. */
kn_status kn_dataset_new(int64_t n, int n_fields, const kn_data_field fields[], kn_dataset_get_fn get,
                         void *ud, void (*free_ud)(void *), kn_dataset **out);
/* Array dataset: data[f] holds n samples of field f back to back. copy=true
 * copies them; false borrows (the arrays must outlive the dataset). */
kn_status kn_dataset_from_arrays(int64_t n, int n_fields, const kn_data_field fields[],
                                 const void *const data[], bool copy, kn_dataset **out);
/* Language-model windows over a token stream: sample i is x = tokens[i*T ..
 * i*T+T) and y = tokens[i*T+1 .. i*T+T+1) (fields "x", "y": i32 [T]), so
 * n = (n_tokens - 1) / T samples, non-overlapping, as llm.c's loader cuts
 * them. token_bytes is 2 (uint16, as in shards) or 4 (int32). The tokens
 * are borrowed unless copy. */
kn_status kn_dataset_tokens(const void *tokens, int token_bytes, int64_t n_tokens, int64_t T, bool copy,
                            kn_dataset **out);
void kn_dataset_free(kn_dataset *ds);
int64_t kn_dataset_len(const kn_dataset *ds);
int kn_dataset_n_fields(const kn_dataset *ds);
const kn_data_field *kn_dataset_field(const kn_dataset *ds, int f);       /* NULL if out of range */
size_t kn_dataset_sample_bytes(const kn_dataset *ds, int f);              /* one sample of field f */
/* Copy one sample (dst[f] per field), e.g. to inspect it. */
kn_status kn_dataset_get(const kn_dataset *ds, int64_t index, void *const dst[]);

/* ---- loader ------------------------------------------------------------------ */
typedef struct kn_loader_opts {
    int64_t batch_size;   /* >= 1                                                   */
    bool shuffle;         /* order of each epoch: Fisher-Yates keyed by (seed, epoch) */
    uint64_t seed;
    bool drop_last;       /* drop a final batch smaller than batch_size             */
    bool prefetch;        /* a background thread fills the next batch (2 buffers)   */
} kn_loader_opts;
kn_loader_opts kn_loader_defaults(void);   /* batch 1, no shuffle, seed 0, keep last, no prefetch */

typedef struct kn_batch {
    int64_t size;                           /* samples in this batch; 0 = end of epoch */
    int64_t epoch, index;                   /* which epoch, which batch within it      */
    const int64_t *indices;                 /* [size] dataset indices of the samples  */
    const void *data[KN_DATA_MAX_FIELDS];   /* field f: size samples back to back      */
} kn_batch;

typedef struct kn_loader kn_loader;

kn_status kn_loader_new(kn_dataset *ds, const kn_loader_opts *opts, kn_loader **out);
/* The next batch of the current epoch. At the end of an epoch it returns
 * KN_OK with b->size == 0 once; the following call starts the next epoch. */
kn_status kn_loader_next(kn_loader *l, kn_batch *b);
/* Continue at batch `index` of epoch `epoch` (e.g. after loading a
 * checkpoint); 0 <= index <= batches per epoch. Stops and restarts prefetch. */
kn_status kn_loader_seek(kn_loader *l, int64_t epoch, int64_t index);
int64_t kn_loader_n_batches(const kn_loader *l);                          /* per epoch */
void kn_loader_free(kn_loader *l);                                        /* joins the thread */
/* The shuffled order of epoch `epoch` (perm[n]) that a loader with this seed
 * uses; n < 2^40, 0 <= epoch < 2^24. */
kn_status kn_shuffle_order(int64_t n, uint64_t seed, int64_t epoch, int64_t *perm);
/* Write field f of a batch into a materialised tensor (kn_input/param/data)
 * with kn_numel == b->size * sample numel (converting to its dtype). */
kn_status kn_batch_write(const kn_batch *b, const kn_dataset *ds, int f, struct kn_tensor *t);

/* ---- MNIST (idx files, gzip or plain) --------------------------------------- */
typedef struct kn_mnist {
    int64_t n, rows, cols;   /* 60000/10000, 28, 28                        */
    uint8_t *images;         /* [n, rows, cols], 0..255                    */
    uint8_t *labels;         /* [n], 0..9                                  */
} kn_mnist;
/* Reads and validates both files: magic 2051 (images: 3 dims) / 2049 (labels:
 * 1 dim), sizes against the data, equal counts, labels 0..9, nothing after
 * the data. gzip is detected (zlib); plain files work too. */
kn_status kn_mnist_load(const char *images_path, const char *labels_path, kn_mnist **out);
void kn_mnist_free(kn_mnist *m);
/* Dataset over m (borrowed: m must outlive it): fields "x" and "y". as_f32:
 * x is f32 [rows, cols] scaled to [0,1] and y i32 (converted per sample as
 * batches are made); else x u8 [rows, cols], y u8. */
kn_status kn_mnist_dataset(const kn_mnist *m, bool as_f32, kn_dataset **out);
/* One idx array: dtype from the type byte (0x08 u8, 0x09 i8, 0x0C i32 (big
 * endian in the file, converted), 0x0D f32, 0x0E f64), dims, data (malloc'd,
 * caller frees). expect_magic: 0 for any, else e.g. 2051. */
kn_status kn_idx_read(const char *path, uint32_t expect_magic, kn_dtype *dtype, int *ndim,
                      int64_t shape[8], void **data);

/* ---- raw text ---------------------------------------------------------------- */
/* Whole file into a NUL-terminated malloc'd buffer (caller frees). */
kn_status kn_text_read(const char *path, char **text, size_t *len);

/* Character vocabulary built from a text: its distinct characters sorted by
 * value (bytes when byte_level, else UTF-8 code points; the text must then be
 * valid UTF-8), ids 0..size-1, like Python's sorted(set(text)). */
typedef struct kn_char_vocab kn_char_vocab;
kn_status kn_char_vocab_build(const char *text, size_t len, bool byte_level, kn_char_vocab **out);
void kn_char_vocab_free(kn_char_vocab *v);
int32_t kn_char_vocab_size(const kn_char_vocab *v);
uint32_t kn_char_vocab_char(const kn_char_vocab *v, int32_t id);   /* byte or code point; 0 if out of range */
/* text -> ids: ids holds at least len entries (one per byte at most); *n
 * gets the count. A character missing from the vocabulary is an error
 * naming its offset. */
kn_status kn_char_encode(const kn_char_vocab *v, const char *text, size_t len, int32_t *ids, int64_t *n);
/* ids -> text: buf holds cap bytes; *len gets the bytes needed (no NUL).
 * KN_ERR_LIMIT when cap is too small. */
kn_status kn_char_decode(const kn_char_vocab *v, const int32_t *ids, int64_t n, char *buf, size_t cap,
                         size_t *len);

/* ---- llm.c token shards --------------------------------------------------------
 * File: 256 int32 header {20240520, 1, n_tokens, 0...}, then n_tokens uint16. */
#define KN_SHARD_MAGIC 20240520
#define KN_SHARD_VERSION 1
/* Reads and validates (magic, version, count vs file size). *tokens is
 * malloc'd (caller frees). */
kn_status kn_shard_read(const char *path, uint16_t **tokens, int64_t *n);
kn_status kn_shard_read_memory(const void *data, size_t size, uint16_t **tokens, int64_t *n);
/* Writes atomically (path.tmp, renamed). Ids must be 0..65535 and n <= INT32_MAX. */
kn_status kn_shard_write(const char *path, const int32_t *tokens, int64_t n);

/* GPT-2 style document tokenization (as llm.c's data scripts do): the text is
 * split at each occurrence of `separator` (e.g. "<|endoftext|>"; NULL or ""
 * means one document), surrounding whitespace of each document is stripped,
 * empty documents are skipped, and each document is emitted as eot followed
 * by its tokens. *ids is malloc'd (caller frees). */
kn_status kn_tokenize_documents(const struct kn_tokenizer *tok, const char *text, size_t len,
                                const char *separator, int32_t eot, int32_t **ids, int64_t *n);
/* Tokenize a text file with kn_tokenize_documents and write the tokens into
 * shards of at most shard_tokens tokens: "<out_prefix>_000000.bin", ...
 * *n_shards and *n_tokens (both may be NULL) get the counts. */
kn_status kn_tokenize_file_to_shards(const struct kn_tokenizer *tok, const char *text_path,
                                     const char *separator, int32_t eot, const char *out_prefix,
                                     int64_t shard_tokens, int *n_shards, int64_t *n_tokens);

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif
