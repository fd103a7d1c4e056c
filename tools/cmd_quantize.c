/* cmd_quantize.c: `kiln quantize IN OUT TYPE` (kn_model_quantize) and
 * `kiln convert HFDIR OUT.gguf [--outtype T]` (kn_model_convert_hf): model
 * files for llama.cpp and kiln; kiln_quantize.h says which tensors change
 * type and how. Exit status: 0 ok, 1 error, 2 usage.
 */
#include "cli.h"
#include "kiln_quantize.h"
#include <stdio.h>
#include <string.h>

static void quantize_usage(FILE *f) {
    fprintf(f,
            "usage: kiln quantize [options] IN OUT TYPE\n"
            "  IN     a GGUF file with f32/f16/bf16 matrices, or a Hugging Face model (directory or .safetensors\n"
            "         with config.json beside it; converted as by kiln convert)\n"
            "  OUT    the GGUF file to write (through OUT.tmp, renamed when complete)\n"
            "  TYPE   q4_k_m, q5_k_m, q4_k_s (= q4_k), q5_k_s (= q5_k), q6_k, q8_0, q4_0, q4_1, q5_0, q5_1\n"
            "         (also f32, f16, bf16): llama.cpp's file types, with its per-tensor rules\n"
            "options:\n"
            "  --allow-requantize  accept quantized input matrices (dequantized, then quantized again: loses accuracy twice)\n"
            "  --pure              every matrix to TYPE (default: the output matrix to q6_k for 4-/5-bit types, as llama.cpp)\n"
            "  -v, --verbose       one line per tensor: shape, type in, type out\n"
            "Quantized: 2-D weight matrices and stacked experts; norms, biases, routers and position tables are kept.\n"
            "The output matrix goes to q6_k. q4_k_s: attn_v of the first 4 layers and ffn_down of the first eighth\n"
            "to q5_k. q4_k_m, q5_k_m: attn_v and ffn_down of the first and last eighth of the layers and of every\n"
            "third layer between to q6_k. 8-expert models: attn_k, attn_v to q8_0 (attn_output q5_k for q4_k_*).\n"
            "Rows that are not whole blocks fall back per tensor (q4_k->q5_0, q5_k->q5_1, q6_k->q8_0, else f16).\n");
}

static void convert_usage(FILE *f) {
    fprintf(f,
            "usage: kiln convert [options] HFDIR OUT.gguf\n"
            "  HFDIR  a Hugging Face model directory: config.json, model.safetensors, and tokenizer.json /\n"
            "         tokenizer_config.json for the vocabulary and chat template (byte-level BPE as llama.cpp's\n"
            "         gpt2 model; SentencePiece-style BPE with byte fallback (Llama 2, Mistral, Gemma) as its\n"
            "         llama model; Unigram and WordPiece are refused: --no-vocab)\n"
            "  OUT    the GGUF file to write, with llama.cpp's tensor names and metadata\n"
            "options:\n"
            "  --outtype T   f32, f16 (default), bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k_s (= q4_k), q5_k_s (= q5_k),\n"
            "                q4_k_m, q5_k_m, q6_k (kiln quantize --help says which tensors get which type)\n"
            "  --no-vocab    write no vocabulary (kiln runs the file on token ids or with -z VOCAB.gguf)\n"
            "  -v, --verbose one line per tensor\n"
            "Architectures: Llama, Mistral, Mixtral (llama.cpp's llama), Qwen2, Qwen3, Qwen2-MoE, Qwen3-MoE, OLMoE,\n"
            "Gemma 2, Gemma 3, Phi-3, GPT-2.\n");
}

/* shared option loop; pos gets the positional arguments */
static int parse(const char *cmd, int argc, char **argv, kn_quantize_params *p, const char **pos, int max_pos,
                 int *n_pos, void (*usage)(FILE *)) {
    for (int i = 2; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) { usage(stdout); return 0; }
        if (!strcmp(o, "-v") || !strcmp(o, "--verbose")) p->verbose = true;
        else if (!strcmp(o, "--allow-requantize")) p->allow_requantize = true;
        else if (!strcmp(o, "--pure")) p->pure = true;
        else if (!strcmp(o, "--no-vocab") && !strcmp(cmd, "convert")) p->no_vocab = true;
        else if (!strcmp(o, "--outtype") && !strcmp(cmd, "convert")) {
            if (i + 1 >= argc) { fprintf(stderr, "kiln convert: --outtype needs a type (e.g. f16)\n"); return 2; }
            if (!kn_quantize_parse_type(argv[++i], p)) { fprintf(stderr, "kiln convert: %s\n", kn_last_error()); return 2; }
        } else if (o[0] == '-' && o[1]) {
            fprintf(stderr, "kiln %s: unknown option '%s' (kiln %s --help lists them)\n", cmd, o, cmd);
            return 2;
        } else if (*n_pos < max_pos) pos[(*n_pos)++] = o;
        else { fprintf(stderr, "kiln %s: too many arguments at '%s' (kiln %s --help)\n", cmd, o, cmd); return 2; }
    }
    return -1;
}

int kn_cli_quantize(int argc, char **argv) {
    kn_quantize_params p = kn_quantize_defaults();
    const char *pos[3] = {0};
    int n = 0, rc = parse("quantize", argc, argv, &p, pos, 3, &n, quantize_usage);
    if (rc >= 0) return rc;
    if (n != 3) {
        fprintf(stderr, "kiln quantize: needs IN OUT TYPE, e.g. kiln quantize model-f16.gguf model-q4_k_m.gguf q4_k_m\n");
        return 2;
    }
    if (!kn_quantize_parse_type(pos[2], &p)) { fprintf(stderr, "kiln quantize: %s\n", kn_last_error()); return 2; }
    if (kn_model_quantize(pos[0], pos[1], &p)) { fprintf(stderr, "kiln quantize: %s\n", kn_last_error()); return 1; }
    fprintf(stderr, "kiln quantize: wrote %s (%s%s)\n", pos[1], kn_dtype_name(p.type),
            p.mix == KN_QUANT_MIX_M ? ", M mix" : "");
    return 0;
}

int kn_cli_convert(int argc, char **argv) {
    kn_quantize_params p = kn_quantize_defaults();
    p.type = KN_F16;
    const char *pos[2] = {0};
    int n = 0, rc = parse("convert", argc, argv, &p, pos, 2, &n, convert_usage);
    if (rc >= 0) return rc;
    if (n != 2) { fprintf(stderr, "kiln convert: needs HFDIR OUT.gguf, e.g. kiln convert SmolLM2-135M/ smollm2-f16.gguf\n"); return 2; }
    if (kn_model_convert_hf(pos[0], pos[1], &p)) { fprintf(stderr, "kiln convert: %s\n", kn_last_error()); return 1; }
    fprintf(stderr, "kiln convert: wrote %s (matrices %s; run it: kiln generate -m %s -p TEXT)\n", pos[1],
            kn_dtype_name(p.type), pos[1]);
    return 0;
}
