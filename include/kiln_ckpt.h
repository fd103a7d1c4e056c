/* kiln_ckpt.h: training checkpoints: named tensors (parameters, optimizer
 * state, step counters) plus string metadata in a .safetensors file that
 * PyTorch's safetensors reads and writes; and llm.c GPT-2 checkpoints
 * (gpt2_124M.bin) mapped to the GPT-2 module's parameter names.
 *
 *   const char *names[] = {"wte.weight", ..., "opt.m.wte.weight", "opt.step"};
 *   kn_tensor *ts[] = {...};                  // materialised: params, kn_empty, inputs
 *   const char *meta[] = {"step", "1200", "seed", "42"};
 *   kn_ckpt_save("run/ckpt.safetensors", n, names, ts, 2, meta);
 *   ...
 *   if (kn_ckpt_load("run/ckpt.safetensors", n, names, ts))
 *       fprintf(stderr, "%s\n", kn_last_error());   // lists every missing/unexpected/mismatched tensor
 *   char step[32];
 *   kn_ckpt_meta("run/ckpt.safetensors", "step", step, sizeof step);
 *
 * Loading is all or nothing: every name, shape and dtype is compared first,
 * and on any difference nothing is written into the tensors.
 *
 * Non-goals: sharded checkpoints, quantized tensors (safetensors cannot hold
 * them), saving without a host copy (save reads every tensor to host memory).
 */
#ifndef KILN_CKPT_H
#define KILN_CKPT_H
#pragma GCC visibility push(default)   /* what libkiln.so exports: the kn_ API (the rest is built -fvisibility=hidden) */
#include "kiln_base.h"

#ifdef __cplusplus
extern "C" {
#endif

struct kn_tensor;
struct kn_llmc_gpt2_config;   /* src/formats/llmc_gpt2.h */

/* ---- safetensors checkpoints ------------------------------------------------ */
/* Save n tensors under names (unique, non-empty) with n_meta (key, value)
 * string pairs meta_kv[2k], meta_kv[2k+1] into the file's __metadata__.
 * Tensors are realized and read (any layout); dtypes f32 f16 bf16 f64 i8 i32
 * i64 u8 bool. Written atomically (path.tmp, then renamed). */
kn_status kn_ckpt_save(const char *path, int64_t n, const char *const names[], struct kn_tensor *const tensors[],
                       int64_t n_meta, const char *const meta_kv[]);

enum {
    KN_CKPT_STRICT = 0,
    KN_CKPT_ALLOW_MISSING = 1,      /* tensors absent from the file keep their values */
    KN_CKPT_ALLOW_UNEXPECTED = 2,   /* tensors of the file nobody asked for are ignored */
};
/* Load the named tensors (materialised: kn_param, kn_empty, kn_input,
 * kn_from_data, or views of them). Refuses (KN_ERR_INVALID, nothing written)
 * when the file lacks a name ("missing"), holds a tensor not asked for
 * ("unexpected"), or a shape or dtype differs; the message lists every
 * difference (as many as fit; kn_ckpt_check gives the whole list). A bad or
 * truncated file gives KN_ERR_FORMAT. */
kn_status kn_ckpt_load(const char *path, int64_t n, const char *const names[], struct kn_tensor *const tensors[]);
kn_status kn_ckpt_load_ex(const char *path, int64_t n, const char *const names[], struct kn_tensor *const tensors[],
                          unsigned flags);
/* Compare without loading. KN_OK when everything matches; otherwise the
 * status kn_ckpt_load would give and, when report is not NULL, a malloc'd
 * text with one line per difference (caller frees). */
kn_status kn_ckpt_check(const char *path, int64_t n, const char *const names[], struct kn_tensor *const tensors[],
                        unsigned flags, char **report);
/* Metadata value of key into buf (NUL-terminated). KN_ERR_INVALID if the key
 * is absent, KN_ERR_LIMIT if cap is too small. */
kn_status kn_ckpt_meta(const char *path, const char *key, char *buf, size_t cap);

/* ---- llm.c GPT-2 checkpoints ---------------------------------------------------
 * llm.c keeps 16 parameter kinds, per-layer ones stacked over L. They map to
 * the GPT-2 module's names (include/kiln_nn.h), with Linear weights [out, in]
 * as llm.c stores them: kind k, layer l -> prefix + format with %d = l. */
typedef struct kn_gpt2_name_map {
    const char *llmc;        /* llm.c's name: "wte", "qkvw", ...                  */
    const char *format;      /* "wte.weight", "h.%d.attn.c_attn.weight", ...      */
    bool per_layer;          /* stacked [L, ...] in llm.c; one tensor per layer    */
} kn_gpt2_name_map;
#define KN_GPT2_N_KINDS 16
/* Indexed by llm.c's kind (kn_gpt2_param in src/formats/llmc_gpt2.h, file order). */
extern const kn_gpt2_name_map kn_gpt2_names[KN_GPT2_N_KINDS];
/* "<prefix><name>" of kind (0..15) and layer (ignored for whole tensors). */
kn_status kn_gpt2_param_name(const char *prefix, int kind, int layer, char *buf, size_t cap);
/* Number of named tensors of a GPT-2 with L layers: 4 + 12 L. */
int64_t kn_gpt2_n_named(int n_layers);

/* Load an llm.c checkpoint (fp32 version 3 or bf16 version 5) into the named
 * tensors. Name set, shapes and dtype kind are checked as kn_ckpt_load does
 * (one message, nothing written on a mismatch); values are converted to each
 * tensor's float dtype. wte may be [V, C] (the padding rows Vp - V of the
 * file are dropped) or [Vp, C]. cfg (may be NULL) receives the file's config. */
kn_status kn_ckpt_load_llmc_gpt2(const char *path, const char *prefix, int64_t n, const char *const names[],
                                 struct kn_tensor *const tensors[], struct kn_llmc_gpt2_config *cfg);
/* Write an llm.c checkpoint of config cfg in dtype KN_F32 or KN_BF16 from the
 * named tensors (exactly the 4 + 12 L GPT-2 names; wte [V, C] is padded with
 * zero rows to Vp). */
kn_status kn_ckpt_save_llmc_gpt2(const char *path, const struct kn_llmc_gpt2_config *cfg, kn_dtype dtype,
                                 const char *prefix, int64_t n, const char *const names[],
                                 struct kn_tensor *const tensors[]);

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif
