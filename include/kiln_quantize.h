/* kiln_quantize.h: write model files that llama.cpp (and kiln) load:
 * quantize a GGUF or Hugging Face model to a GGUF of another tensor type, and
 * convert a Hugging Face model directory to GGUF.
 *
 *   kn_quantize_params qp = kn_quantize_defaults();
 *   kn_quantize_parse_type("q4_k_m", &qp);            // Q4_K, mix M
 *   if (kn_model_quantize("model-f16.gguf", "model-q4_k_m.gguf", &qp)) puts(kn_last_error());
 *   qp.type = KN_F32;
 *   if (kn_model_convert_hf("SmolLM2-135M/", "smollm2-f32.gguf", &qp)) puts(kn_last_error());
 *
 * Which tensors change type (llama.cpp's rules, llama-quantize without an
 * importance matrix): 2-D and 3-D (stacked experts) weight matrices; never
 * norms, biases, rope factors, MoE routers (ffn_gate_inp) or position
 * tables, which stay as they are (quantize) or f32 (convert). The output
 * matrix (output.weight, or token_embd.weight when the head is tied) goes to
 * Q6_K for every 4- and 5-bit target and for Q6_K (Q8_0 stays Q8_0; float
 * targets stay float). q4_k adds llama.cpp's Q4_K_S bumps (attn_v of
 * layers 0-3 and ffn_down of the first eighth of the layers to Q5_K); the
 * M mixes (Q4_K_M, Q5_K_M) put attn_v and ffn_down of the first and last
 * eighth of the layers and every third layer between in Q6_K; 8-expert
 * models get attn_k / attn_v in Q8_0 (and attn_output in Q5_K for Q4_K_S /
 * Q4_K_M), as llama.cpp does (src/llm/quantize_rules.c; its 70B-only rule
 * and the Q2/Q3/IQ mixes are not copied). A matrix whose rows are not whole blocks of the
 * target (32 elements; 256 for the K types) falls back per tensor as
 * llama.cpp does: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, and to F16 when
 * the row is not a multiple of 32 either. Quantizers: ggml's reference
 * algorithms (src/backends/quant/quantize.h). The file is written to
 * OUT.tmp and renamed: a failed write (full disk) leaves no file under OUT.
 */
#ifndef KILN_QUANTIZE_H
#define KILN_QUANTIZE_H
#include "kiln_base.h"
#pragma GCC visibility push(default)

/* How the K targets spread bits over the layers: llama.cpp's *_S and *_M
 * files (kiln_quantize.h's header lists the rules). */
typedef enum kn_quant_mix {
    KN_QUANT_MIX_S = 0,       /* q4_k = Q4_K_S, q5_k = Q5_K_S: few bumps (the default)          */
    KN_QUANT_MIX_M = 1,       /* Q4_K_M, Q5_K_M: attn_v and ffn_down of about half the layers to Q6_K */
} kn_quant_mix;

typedef struct kn_quantize_params {
    kn_dtype type;            /* F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K
                                 (kn_quantize_parse_type sets it and mix from "q4_k_m" etc.) */
    bool allow_requantize;    /* quantized input matrices may be dequantized and quantized again
                                 (loses accuracy twice); false: such an input is refused */
    bool pure;                /* every eligible matrix to `type` (no Q6_K output, no bumps) */
    bool verbose;             /* one line per tensor on stderr: name, shape, type chosen */
    bool no_vocab;            /* convert: write no vocabulary even when tokenizer.json is there */
    kn_quant_mix mix;         /* Q4_K / Q5_K targets: S (default) or M */
} kn_quantize_params;

kn_quantize_params kn_quantize_defaults(void);   /* Q8_0, no requantize, not pure, quiet */
/* A target type by name, case-insensitive ("q4_k", "Q8_0", "bf16", ...);
 * false (and an error naming the choices) for another name. */
bool kn_quantize_type_from_name(const char *name, kn_dtype *out);
/* A target by llama.cpp's file-type name or a type name, case-insensitive:
 * "q4_k_m", "Q5_K_M", "q4_k_s" (= "q4_k"), "q5_k_s", "q6_k", "q8_0", "f16",
 * ...: sets p->type and p->mix; false (and an error naming the choices) for
 * another name. */
bool kn_quantize_parse_type(const char *name, kn_quantize_params *p);

/* in: a GGUF file (F32/F16/BF16 matrices; quantized ones only with
 * allow_requantize), or a Hugging Face model (directory or .safetensors
 * path with config.json beside it), which goes through kn_model_convert_hf.
 * Metadata is copied, general.file_type set to the target's. */
kn_status kn_model_quantize(const char *in, const char *out, const kn_quantize_params *p);

/* A Hugging Face model (a directory with config.json, model.safetensors and
 * optionally tokenizer.json / tokenizer_config.json) as GGUF with
 * llama.cpp's tensor names, layouts and metadata: llama (LlamaForCausalLM,
 * MistralForCausalLM, MixtralForCausalLM; q/k rows permuted for llama.cpp's
 * paired rope, as its convert_hf_to_gguf.py does), qwen2, qwen3, qwen2moe,
 * qwen3moe, olmoe, gemma2, gemma3 (norm gains stored as 1 + w), phi3 (fused
 * qkv / gate-up kept) and gpt2 (Conv1D weights transposed). The vocabulary
 * (byte-level BPE tokenizer.json as llama.cpp's "gpt2" model: tokens,
 * types, merges, special ids, the pre-tokenizer's llama.cpp name;
 * SentencePiece-style BPE with byte fallback (Llama 2, Mistral, Gemma) as its
 * "llama" model: tokens, scores from the merge order, types, special ids,
 * add_space_prefix) and the chat template are written when tokenizer.json is
 * there; without it the file has no vocabulary (kiln runs it on token ids,
 * llama.cpp needs one). A vocabulary llama.cpp's "llama"/"gpt2" tokenizers
 * cannot reproduce (Unigram, WordPiece, a BPE whose merges are not
 * SentencePiece's) is refused with KN_ERR_UNSUPPORTED unless p->no_vocab.
 * p->type is the matrices' type. */
kn_status kn_model_convert_hf(const char *hf_path, const char *out, const kn_quantize_params *p);

#pragma GCC visibility pop
#endif
