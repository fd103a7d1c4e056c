/* kiln.c: the command-line program.
 *
 *   kiln generate -m MODEL -p PROMPT [-n N] [--temp T --top-k K --top-p P --min-p M --seed S] [--chat]
 *   kiln chat -m MODEL [--system TEXT] [--chat-template chatml|llama2|llama3]
 *   kiln info MODEL
 *   kiln bench -m MODEL [-p 512] [-n 128] [-r 3]
 *   kiln perplexity -m MODEL -f TEXT|- [--ctx N] [--stride N]
 *   (generate, chat, bench, perplexity, tokenize: --backend cpu|cuda, --gpu-dtype bf16|f16|f32)
 *
 * Generated text goes to stdout; statistics and messages go to stderr, so
 * stdout holds only the text. Exit status: 0 ok, 1 error, 2 usage.
 */
#include "cli.h"
#include "cli_num.h"
#include "backends/cpu/threadpool.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(void) {
    fprintf(stderr,
            "usage: kiln <command> [options]\n"
            "  generate -m MODEL -p PROMPT   generate text (stdout), speed on stderr\n"
            "  chat -m MODEL                 interactive chat (/reset starts over; Ctrl-C stops a reply;\n"
            "                                Ctrl-D, or Ctrl-C at the prompt, quits)\n"
            "  info MODEL                    architecture, hyperparameters, tensors, tokenizer\n"
            "  bench -m MODEL                prefill and decode tokens/s (median of runs)\n"
            "  perplexity -m MODEL -f FILE   perplexity of a text file\n"
            "  tokenize -m MODEL -p TEXT     print the token ids of TEXT\n"
            "  train mnist|char|gpt2 ...     train a model (kiln train --help)\n"
            "options:\n"
            "  -m FILE        model: GGUF (llama), llama2.c .bin, llm.c GPT-2 .bin, or a Hugging Face\n"
            "                 safetensors file/directory with config.json (Llama, GPT-2)\n"
            "  -z FILE        tokenizer: llama2.c tokenizer.bin, a GGUF vocabulary (.gguf), or llm.c\n"
            "                 gpt2_tokenizer.bin (decode only); needed for models without one\n"
            "  --kv-f16       keep the KV cache in f16 (half the memory)\n"
            "  -p TEXT        prompt                      -n N      tokens to generate (default 256)\n"
            "  --temp T       temperature, 0 = greedy     --seed S  random seed\n"
            "  --top-k K  --top-p P  --min-p M  --repeat-penalty R  --frequency-penalty F  --presence-penalty P\n"
            "  --stop TEXT    stop string (repeatable)    --chat    wrap -p in the model's chat template\n"
            "  --system TEXT  system prompt for chat      --chat-template chatml|llama2|llama3\n"
            "  --backend cpu|cuda  where the model runs (default: KN_BACKEND, else cpu)\n"
            "  --gpu-dtype bf16|f16|f32  weight matrices on the GPU (default bf16; f32 = the CPU's exact path)\n"
            "  --ctx N        context length              -t N      threads (default: all cores)\n"
            "  -f FILE        text for perplexity (- = stdin)   -r N      bench repetitions (default 3)\n"
            "  --stride N     perplexity: windows of --ctx tokens every N tokens, scoring the last N of each\n"
            "                 (llama.cpp's --ppl-stride); default 0: side-by-side windows scoring their second half\n");
}

static int parse(int argc, char **argv, int start, cli_args *a) {
    a->n = 256; a->reps = 3; a->n_prompt_bench = 512;
    a->sp = kn_sampler_defaults();
    for (int i = start; i < argc; i++) {
        const char *o = argv[i];
        bool has = i + 1 < argc;
#define NEXT() (has ? argv[++i] : (fprintf(stderr, "kiln: option %s needs a value\n", o), (char *)NULL))
        if (!strcmp(o, "-m")) { if (!(a->model = NEXT())) return -1; }
        else if (!strcmp(o, "-p")) { if (!(a->prompt = NEXT())) return -1; }
        else if (!strcmp(o, "-z")) { if (!(a->tokenizer = NEXT())) return -1; }
        else if (!strcmp(o, "-f")) { if (!(a->file = NEXT())) return -1; }
        else if (!strcmp(o, "--system")) { if (!(a->system = NEXT())) return -1; }
        else if (!strcmp(o, "--chat-template")) { if (!(a->tmpl = NEXT())) return -1; }
        else if (!strcmp(o, "--backend")) { if (!(a->backend = NEXT())) return -1; }
        else if (!strcmp(o, "--gpu-dtype")) { if (!(a->gpu_dtype = NEXT())) return -1; }
        else if (!strcmp(o, "--stop")) { const char *s = NEXT(); if (!s) return -1; if (a->n_stop < 8) a->stop[a->n_stop++] = s; }
        else if (!strcmp(o, "--chat")) a->chat = true;
        else if (!strcmp(o, "--kv-f16")) a->kv_f16 = true;
        else if (!strcmp(o, "--stride")) {            /* perplexity: 0 = llama.cpp's default windows */
            const char *v = NEXT();
            int64_t x;
            if (!v || !cli_int("kiln", o, v, 0, 1 << 20, &x)) return -1;
            a->stride = (int)x;
        }
        else {
            const char *v = NEXT();
            if (!v) return -1;
            char *end;
            double x = strtod(v, &end);
            if (*end) { fprintf(stderr, "kiln: %s expects a number, got '%s'\n", o, v); return -1; }
            if (!strcmp(o, "-n")) a->n = (int)x;
            else if (!strcmp(o, "--temp")) { a->sp.temp = (float)x; a->have_temp = true; }
            else if (!strcmp(o, "--top-k")) a->sp.top_k = (int)x;
            else if (!strcmp(o, "--top-p")) a->sp.top_p = (float)x;
            else if (!strcmp(o, "--min-p")) a->sp.min_p = (float)x;
            else if (!strcmp(o, "--seed")) a->sp.seed = (uint64_t)x;
            else if (!strcmp(o, "--repeat-penalty")) a->sp.repeat_penalty = (float)x;
            else if (!strcmp(o, "--frequency-penalty")) a->sp.freq_penalty = (float)x;
            else if (!strcmp(o, "--presence-penalty")) a->sp.presence_penalty = (float)x;
            else if (!strcmp(o, "--ctx")) a->ctx = (int)x;
            else if (!strcmp(o, "--batch")) a->batch = (int)x;
            else if (!strcmp(o, "-t")) a->threads = (int)x;
            else if (!strcmp(o, "-r")) a->reps = (int)x;
            else if (!strcmp(o, "--bench-prompt")) a->n_prompt_bench = (int)x;
            else { fprintf(stderr, "kiln: unknown option %s\n", o); return -1; }
        }
#undef NEXT
    }
    if (a->threads > 0) kn_pool_set_threads(a->threads);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) { usage(); return argc < 2 ? 2 : 0; }
    cli_args a = {0};
    const char *cmd = argv[1];
    if (!strcmp(cmd, "info")) {
        if (argc < 3) { fprintf(stderr, "usage: kiln info MODEL\n"); return 2; }
        if (kn_model_print_info(argv[2], stdout) != KN_OK) { fprintf(stderr, "kiln: %s\n", kn_last_error()); return 1; }
        return 0;
    }
    if (!strcmp(cmd, "train")) return kn_cli_train(argc, argv);
    if (parse(argc, argv, 2, &a)) { usage(); return 2; }
    if (!strcmp(cmd, "generate")) return cmd_generate(&a);
    if (!strcmp(cmd, "chat")) return cmd_chat(&a);
    if (!strcmp(cmd, "bench")) return cmd_bench(&a);
    if (!strcmp(cmd, "perplexity")) return cmd_perplexity(&a);
    if (!strcmp(cmd, "tokenize")) return cmd_tokenize(&a);
    fprintf(stderr, "kiln: unknown command '%s'\n", cmd);
    usage();
    return 2;
}
