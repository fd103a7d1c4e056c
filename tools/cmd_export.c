/* cmd_export.c: `kiln export -m CKPT -o OUT.gguf [-z VOCAB.gguf]`: a GPT
 * trained by `kiln train char|gpt2` as a GGUF file that llama.cpp (and
 * `kiln generate`) loads: llama.cpp's gpt2 architecture, f32, with the
 * tokenizer (kn_model_export_gguf in kiln_llm.h says how the vocabulary is
 * written). Exit status: 0 ok, 1 error, 2 usage.
 */
#include "cli.h"
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static void export_usage(FILE *f) {
    fprintf(f,
            "usage: kiln export -m CKPT -o OUT.gguf [-z VOCAB.gguf]\n"
            "  -m CKPT        checkpoint of `kiln train char` or `kiln train gpt2` (--out of the run)\n"
            "  -o OUT.gguf    the GGUF file to write (llama.cpp gpt2 architecture, f32, with the tokenizer)\n"
            "  -z VOCAB.gguf  gpt2 models: the GPT-2 vocabulary [default: the file recorded at training]\n"
            "char models need an ASCII vocabulary; a gpt2 model trained on a compact vocabulary is written\n"
            "with all 50257 GPT-2 ids.\n");
}

int kn_cli_export(int argc, char **argv) {
    const char *in = NULL, *out = NULL, *tok = NULL;
    for (int i = 2; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) { export_usage(stdout); return 0; }
        const char **dst = !strcmp(o, "-m") ? &in : !strcmp(o, "-o") ? &out : !strcmp(o, "-z") ? &tok : NULL;
        if (!dst) { fprintf(stderr, "kiln export: unknown option '%s' (kiln export --help lists them)\n", o); return 2; }
        if (i + 1 >= argc || !*argv[i + 1]) { fprintf(stderr, "kiln export: option %s needs a file name\n", o); return 2; }
        *dst = argv[++i];
    }
    if (!in || !out) {
        fprintf(stderr, "kiln export: %s is required (kiln export -m CKPT -o OUT.gguf)\n", !in ? "-m CKPT" : "-o OUT.gguf");
        return 2;
    }
    struct stat si, so;
    if (stat(in, &si) == 0 && stat(out, &so) == 0 && si.st_dev == so.st_dev && si.st_ino == so.st_ino) {
        fprintf(stderr, "kiln export: -o %s is the checkpoint itself; name another file (e.g. model.gguf)\n", out);
        return 2;
    }
    if (kn_model_export_gguf(in, tok, out)) { fprintf(stderr, "kiln export: %s\n", kn_last_error()); return 1; }
    fprintf(stderr, "kiln export: wrote %s (run it: kiln generate -m %s -p TEXT)\n", out, out);
    return 0;
}
