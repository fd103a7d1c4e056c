/* kiln_base.h: status codes and the dtype table, shared by every kiln header.
 *
 * Errors: functions that can fail on user input or the environment return
 * kn_status (0 = KN_OK) and leave a message for kn_last_error(); library code
 * never exits or aborts on bad input. Messages say what went wrong and what
 * to do next.
 */
#ifndef KILN_BASE_H
#define KILN_BASE_H
#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library's version; kn_version() returns the one it was built as (which
 * can differ from the header a program was compiled with, for libkiln.so). */
#define KN_VERSION "0.1.0"
const char *kn_version(void);

typedef enum kn_status {
    KN_OK = 0,
    KN_ERR_INVALID,      /* bad argument: wrong shape, axis, dtype, parameter   */
    KN_ERR_NOMEM,        /* out of host or device memory                         */
    KN_ERR_IO,           /* file missing, unreadable, short read                 */
    KN_ERR_FORMAT,       /* malformed or unsupported file contents               */
    KN_ERR_UNSUPPORTED,  /* valid request this build or backend cannot do        */
    KN_ERR_STATE,        /* use of a freed/unrealized object, wrong call order   */
    KN_ERR_BACKEND,      /* a backend (e.g. CUDA) call failed                    */
    KN_ERR_LIMIT,        /* a size limit was hit: context length, max dims, ...  */
} kn_status;

const char *kn_status_str(kn_status s);   /* "invalid argument", ...            */
/* The message of the most recent error on this thread ("" if none). */
const char *kn_last_error(void);
/* Record an error (printf-style) and return its status; for library code. */
kn_status kn_set_error(kn_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void kn_clear_error(void);

/* ---- dtypes ------------------------------------------------------------------
 * Append only: values are stored in files. Quantized types are blocks of
 * `block_size` elements taking `type_size` bytes; their layout is bit-for-bit
 * the GGUF/ggml one so GGUF tensors can be used in place (memory-mapped). */
typedef enum kn_dtype {
    KN_F32 = 0, KN_F16, KN_BF16, KN_F64,
    KN_I8, KN_I32, KN_I64, KN_U8, KN_BOOL,
    KN_Q4_0, KN_Q4_1, KN_Q5_0, KN_Q5_1, KN_Q8_0, KN_Q8_1,
    KN_Q4_K, KN_Q5_K, KN_Q6_K, KN_Q8_K,
    KN_DTYPE_COUNT
} kn_dtype;

typedef struct kn_dtype_info {
    const char *name;     /* "f32", "q4_0", ...                                  */
    int64_t block_size;   /* elements per block (1 for plain types)              */
    size_t  type_size;    /* bytes per block                                     */
    bool    is_float;     /* f32/f16/bf16/f64                                    */
    bool    is_int;       /* i8/i32/i64/u8/bool                                  */
    bool    is_quant;     /* block-quantized                                     */
} kn_dtype_info;

const kn_dtype_info *kn_dtype_get(kn_dtype t);  /* NULL for an unknown value     */
const char *kn_dtype_name(kn_dtype t);          /* "?" for an unknown value      */
/* Bytes taken by n elements of t (n must be a multiple of the block size). */
size_t kn_dtype_nbytes(kn_dtype t, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
