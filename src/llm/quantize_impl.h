/* quantize_impl.h: what `kiln quantize` (quantize_model.c) and `kiln convert`
 * (convert_hf.c) share: a list of output tensors, each with a way to produce
 * its f32 values, and the writer that picks each tensor's type (llama.cpp's
 * rules, kiln_quantize.h), quantizes and writes the file. Not a public API.
 */
#ifndef KN_QUANTIZE_IMPL_H
#define KN_QUANTIZE_IMPL_H
#include "kiln_quantize.h"
#include "formats/gguf_write.h"   /* defines: kn_gguf_writer */

typedef struct kn__qt kn__qt;
/* The tensor's f32 values, [numel] with ne[0] innermost. */
typedef kn_status (*kn__qt_fill)(const kn__qt *t, float *dst);

struct kn__qt {
    char name[128];             /* llama.cpp's name, e.g. blk.0.attn_q.weight      */
    int n_dims;                 /* 1..4                                            */
    int64_t ne[4];              /* GGML order: ne[0] the row length               */
    kn_dtype src_type;          /* the source's type (quantized: requantize rules) */
    const void *raw;            /* source bytes already in the output layout, or NULL
                                   (then only fill gives the values)              */
    kn_dtype keep_type;         /* the type when the tensor is not quantized: the
                                   source's (quantize) or F32 (convert)           */
    bool no_quant;              /* never quantized (norm gains, routers, ...)     */
    kn__qt_fill fill;
    const void *a, *b;          /* fill's sources (convert: safetensors tensors)  */
    int64_t arg[4];             /* fill's integers (heads, experts, ...)          */
    void *ud;
};

/* Chooses each tensor's type for p, fills, quantizes and writes all of them
 * with the key/values already in w (general.file_type and
 * general.quantization_version are added here) to path (through path.tmp).
 * name_of_arch: for messages. Frees nothing of ts. */
kn_status kn__qwrite(kn_gguf_writer *w, kn__qt *ts, int64_t n, const kn_quantize_params *p, const char *path);
/* convert_vocab.c: model m's tokenizer.json (if any, and unless p->no_vocab)
 * as llama.cpp's tokenizer.ggml.* keys in w, V rows (the embedding's; the
 * rest "[PADn]"); dir names the model directory in messages and holds
 * tokenizer_config.json (add_eos_token). */
struct kn_model;
kn_status kn__convert_vocab(kn_gguf_writer *w, const struct kn_model *m, int64_t V, const kn_quantize_params *p,
                            const char *dir);
/* quantize_rules.c: the type of each of the n tensors for p into type[n]
 * (llama.cpp's llama_tensor_get_type; see the file). */
kn_status kn__qpick_types(const kn__qt *ts, int64_t n, const kn_quantize_params *p, kn_dtype *type);
/* llama.cpp's general.file_type (LLAMA_FTYPE_*) for a target type. */
uint32_t kn__qfile_type(kn_dtype t);
#endif
