/* cli_args.c: the option table of the kiln program and the parser it drives
 * (cli_args.h). */
#include "cli_args.h"
#include "cli_num.h"
#include <inttypes.h>
#include <stddef.h>
#include <string.h>

/* ---- subcommands ---------------------------------------------------------------- */
typedef struct cli_sub_info {
    const char *name, *synopsis, *what;
} cli_sub_info;

static const cli_sub_info SUBS[CLI_N_SUBS] = {
    [CLI_GENERATE] = {"generate", "kiln generate -m MODEL -p PROMPT [options]",
                      "Generates text from a prompt: the text goes to stdout, the speed to stderr."},
    [CLI_CHAT] = {"chat", "kiln chat -m MODEL [options]",
                  "Interactive chat on the terminal or a pipe: one user turn per line; /reset starts over, Ctrl-C stops a reply, Ctrl-D (or Ctrl-C at the prompt) quits."},
    [CLI_INFO] = {"info", "kiln info MODEL",
                  "Prints the architecture, hyperparameters, tensors and tokenizer of a model file."},
    [CLI_BENCH] = {"bench", "kiln bench -m MODEL [options]",
                   "Prefill (pp) and decode (tg) speed in tokens/s, the median of -r runs, as a Markdown table on stdout."},
    [CLI_PERPLEXITY] = {"perplexity", "kiln perplexity -m MODEL -f FILE|- [options]",
                        "The perplexity of a text under the model, with llama.cpp's windows (the same number as llama-perplexity)."},
    [CLI_TOKENIZE] = {"tokenize", "kiln tokenize -m MODEL -p TEXT [options]",
                      "Prints the token ids of TEXT on one line, space separated."},
    [CLI_SERVE] = {"serve", "kiln serve -m MODEL [options]",
                   "An OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, /v1/models, /health, "
                   "/metrics) with continuous batching, tool calls (through the model's chat template), and a chat page at "
                   "http://HOST:PORT/; Ctrl-C stops it."},
};

bool cli_sub_find(const char *name, cli_sub *out) {
    for (int s = 0; s < CLI_N_SUBS; s++)
        if (name && !strcmp(name, SUBS[s].name)) { *out = (cli_sub)s; return true; }
    return false;
}

const char *cli_sub_name(cli_sub sub) {
    return (unsigned)sub < CLI_N_SUBS ? SUBS[sub].name : "?";
}

/* ---- the option table ------------------------------------------------------------ */
typedef enum opt_kind {
    OPT_FLAG,    /* bool, no value                               */
    OPT_STR,     /* const char *                                 */
    OPT_STOP,    /* appended to stop[] (repeatable)              */
    OPT_INT,     /* int in [lo, hi]                              */
    OPT_REAL,    /* float in [lo, hi] (lo excluded when lo_open) */
    OPT_U64,     /* uint64_t, any value                          */
} opt_kind;

#define NO_FIELD ((size_t)-1)

typedef struct cli_opt {
    const char *name, *alias;   /* "-n", "--max-tokens" (alias may be NULL)            */
    opt_kind kind;
    unsigned subs;              /* bit (1u << cli_sub) for each subcommand taking it    */
    size_t field, given;        /* offsets in cli_args; given: a bool set when the
                                   option appears (NO_FIELD: none)                      */
    const char *def;            /* default, parsed like a given value (NULL: none)      */
    const char *shown;          /* the default in words, when def is NULL               */
    double lo, hi;
    bool lo_open;               /* REAL: lo itself is not allowed                       */
    const char *choices;        /* STR: "cpu|cuda" (NULL: any text)                     */
    bool required;
    const char *meta, *help;
} cli_opt;

#define G (1u << CLI_GENERATE)
#define C (1u << CLI_CHAT)
#define I (1u << CLI_INFO)
#define B (1u << CLI_BENCH)
#define P (1u << CLI_PERPLEXITY)
#define T (1u << CLI_TOKENIZE)
#define S (1u << CLI_SERVE)
#define F(x) offsetof(cli_args, x)

/* Ranges, and why:
 *  -n 0 is the library's "until the end of text or the context is full";
 *  --ctx/--batch at most 2^20: far above any model here (the model's own
 *    context limit is checked when it loads);
 *  -t at most 4096 here; kiln.c lowers counts above the cores to the cores;
 *  --temp: 0 is greedy; above 100 every token is about equally likely;
 *  --top-p: 0 would keep nothing; --repeat-penalty divides logits: 0 or a
 *    denormal makes them infinite, hence 0.01;
 *  --frequency/presence-penalty: the OpenAI range. */
static const cli_opt OPTS[] = {
    {"-m", "--model", OPT_STR, G | C | I | B | P | T | S, F(model), NO_FIELD, NULL, NULL, 0, 0, false, NULL, true, "FILE",
     "model: GGUF (llama incl. Mixtral, qwen2, qwen3, qwen2moe, qwen3moe, olmoe, gemma2, gemma3, phi3, gpt2), llama2.c .bin, llm.c GPT-2 .bin, or a Hugging Face safetensors file or directory (Llama, Mistral, Qwen2, Qwen3, Gemma 2/3, Phi-3, Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, GPT-2)"},
    {"-z", "--tokenizer", OPT_STR, G | C | B | P | T | S, F(tokenizer), NO_FIELD, NULL, "the model's own", 0, 0, false, NULL, false, "FILE",
     "tokenizer: Hugging Face tokenizer.json (or its model directory, with tokenizer_config.json), llama2.c tokenizer.bin, a GGUF vocabulary, or llm.c gpt2_tokenizer.bin (decode only); needed for models without one"},
    {"-p", "--prompt", OPT_STR, G, F(prompt), NO_FIELD, NULL, NULL, 0, 0, false, NULL, true, "TEXT", "the prompt"},
    {"-p", "--prompt", OPT_STR, T, F(prompt), NO_FIELD, NULL, NULL, 0, 0, false, NULL, true, "TEXT", "the text to tokenize"},
    {"-p", "--bench-prompt", OPT_INT, B, F(n_prompt_bench), NO_FIELD, "512", NULL, 1, 1 << 20, false, NULL, false, "N",
     "prompt tokens of the prefill test (shortened to fit the context)"},
    {"-n", "--max-tokens", OPT_INT, G | C, F(n), NO_FIELD, "256", NULL, 0, 1 << 20, false, NULL, false, "N",
     "tokens to generate (chat: per reply); 0 = until the end of the text or of the context"},
    {"-n", "--decode-tokens", OPT_INT, B, F(n), NO_FIELD, "128", NULL, 1, 1 << 20, false, NULL, false, "N",
     "tokens of the decode test"},
    {"-f", "--file", OPT_STR, P, F(file), NO_FIELD, NULL, NULL, 0, 0, false, NULL, true, "FILE", "the text to measure; - reads standard input"},
    {"--stride", NULL, OPT_INT, P, F(stride), NO_FIELD, "0", NULL, 0, 1 << 20, false, NULL, false, "N",
     "windows of --ctx tokens every N tokens, each scoring its last N (llama.cpp's --ppl-stride; below --ctx); 0 = side-by-side windows scoring their second half"},
    {"--chat", NULL, OPT_FLAG, G, F(chat), NO_FIELD, NULL, NULL, 0, 0, false, NULL, false, NULL,
     "wrap -p in the chat template as a user turn"},
    {"--system", NULL, OPT_STR, G | C, F(system), NO_FIELD, NULL, "none", 0, 0, false, NULL, false, "TEXT",
     "system prompt (generate: with --chat)"},
    {"--chat-template", NULL, OPT_STR, G | C | S, F(tmpl), NO_FIELD, NULL, "the model's own", 0, 0, false, NULL, false, "NAME",
     "chatml, llama2, llama3, smollm or plain (\"User: text\" lines, no special tokens)"},
    {"--temp", NULL, OPT_REAL, G, F(sp.temp), F(have_temp), "0.8", NULL, 0, 100, false, NULL, false, "T",
     "temperature; 0 = greedy (always the likeliest token)"},
    {"--temp", NULL, OPT_REAL, C, F(sp.temp), F(have_temp), "0.7", NULL, 0, 100, false, NULL, false, "T",
     "temperature; 0 = greedy (always the likeliest token)"},
    {"--top-k", NULL, OPT_INT, G | C, F(sp.top_k), NO_FIELD, "40", NULL, 0, 1 << 20, false, NULL, false, "K",
     "sample from the K likeliest tokens; 0 = all"},
    {"--top-p", NULL, OPT_REAL, G | C, F(sp.top_p), NO_FIELD, "0.95", NULL, 0, 1, true, NULL, false, "P",
     "sample from the likeliest tokens whose probabilities add up to P; 1 = off"},
    {"--min-p", NULL, OPT_REAL, G | C, F(sp.min_p), NO_FIELD, "0.05", NULL, 0, 1, false, NULL, false, "M",
     "drop tokens less likely than M times the likeliest; 0 = off"},
    {"--repeat-penalty", NULL, OPT_REAL, G | C, F(sp.repeat_penalty), NO_FIELD, "1", NULL, 0.01, 100, false, NULL, false, "R",
     "divide the logits of the last 64 tokens by R (above 1: repeat less); 1 = off"},
    {"--frequency-penalty", NULL, OPT_REAL, G | C, F(sp.freq_penalty), NO_FIELD, "0", NULL, -2, 2, false, NULL, false, "F",
     "subtract F times a recent token's count from its logit; 0 = off"},
    {"--presence-penalty", NULL, OPT_REAL, G | C, F(sp.presence_penalty), NO_FIELD, "0", NULL, -2, 2, false, NULL, false, "P",
     "subtract P from the logit of every recent token; 0 = off"},
    {"--seed", NULL, OPT_U64, G | C, F(sp.seed), F(have_seed), NULL, "random (-v prints it)", 0, 0, false, NULL, false, "S",
     "sampling seed, 0 to 2^64-1: the same seed, model and options repeat a run"},
    {"--stop", NULL, OPT_STOP, G | C, F(stop), NO_FIELD, NULL, "none", 0, 0, false, NULL, false, "TEXT",
     "stop when the output contains TEXT (not printed); up to 8"},
    {"--ctx", NULL, OPT_INT, G | C | B | P, F(ctx), NO_FIELD, NULL, "the model's, at most 4096", 1, 1 << 20, false, NULL, false, "N",
     "context length in tokens"},
    {"--ctx", NULL, OPT_INT, S, F(ctx), NO_FIELD, NULL, "the model's context, at most 4096", 16, 1 << 24, false, NULL, false, "N",
     "KV cache tokens shared by all requests (a pool of 16-token blocks taken on demand); one request's prompt and output fit in the smaller of this and the model's context"},
    {"--host", NULL, OPT_STR, S, F(host), NO_FIELD, "127.0.0.1", NULL, 0, 0, false, NULL, false, "ADDR",
     "address to listen on (0.0.0.0 or :: for every interface; with --api-key then)"},
    {"--port", NULL, OPT_INT, S, F(port), NO_FIELD, "8080", NULL, 0, 65535, false, NULL, false, "N",
     "TCP port; 0 picks a free one (printed on stderr)"},
    {"--parallel", NULL, OPT_INT, S, F(parallel), NO_FIELD, "4", NULL, 1, 256, false, NULL, false, "N",
     "requests generated at once, in one batched step (the others wait in the queue)"},
    {"--queue", NULL, OPT_INT, S, F(queue), NO_FIELD, "64", NULL, 0, 100000, false, NULL, false, "N",
     "requests that may wait for a slot; beyond them the server answers 429"},
    {"--timeout", NULL, OPT_INT, S, F(timeout), NO_FIELD, "600", NULL, 0, 86400, false, NULL, false, "SECONDS",
     "a request still running after this long (queued time included) is ended with an error; 0 = no limit"},
    {"--max-body", NULL, OPT_INT, S, F(max_body), NO_FIELD, "1048576", NULL, 1024, 1 << 30, false, NULL, false, "BYTES",
     "largest request body; a larger one is answered 413"},
    {"--api-key", NULL, OPT_STR, S, F(api_key), NO_FIELD, NULL, "none", 0, 0, false, NULL, false, "KEY",
     "require 'Authorization: Bearer KEY' on every endpoint but /health and the page"},
    {"--batch", NULL, OPT_INT, G | C | B | P | S, F(batch), NO_FIELD, NULL, "512", 1, 1 << 20, false, NULL, false, "N",
     "tokens per forward pass while reading the prompt"},
    {"-t", "--threads", OPT_INT, G | C | B | P | S, F(threads), NO_FIELD, NULL, "all cores", 1, 4096, false, NULL, false, "N",
     "CPU threads (at most the number of cores)"},
    {"--gpus", NULL, OPT_INT, G | B | P, F(gpus), NO_FIELD, "1", NULL, 1, 256, false, NULL, false, "N",
     "tensor parallel: N ranks (one process per GPU, started by kiln run), each holding 1/N of every layer's "
     "attention heads and FFN columns and of the output head's vocabulary rows"},
    {"-r", "--reps", OPT_INT, B, F(reps), NO_FIELD, "3", NULL, 1, 1000, false, NULL, false, "N", "runs of each test"},
    {"--kv-f16", NULL, OPT_FLAG, G | C | B | P, F(kv_f16), NO_FIELD, NULL, NULL, 0, 0, false, NULL, false, NULL,
     "keep the KV cache in f16 (half the memory)"},
    {"--backend", NULL, OPT_STR, G | C | B | P | T | S, F(backend), NO_FIELD, NULL, "KN_BACKEND, else cpu", 0, 0, false, "cpu|cuda", false,
     "NAME", "where the model runs: cpu or cuda"},
    {"--gpu-dtype", NULL, OPT_STR, G | C | B | P | T | S, F(gpu_dtype), NO_FIELD, NULL, "bf16", 0, 0, false, "bf16|f16|f32|file", false,
     "TYPE", "weight matrices on the GPU (--backend cuda): bf16, f16, f32 (the CPU's exact path), or file (as the "
     "file stores them: GGUF Q4_0..Q8_0, Q4_K..Q6_K blocks stay quantized; less memory, faster decode of larger "
     "models, slower prefill)"},
    {"-v", "--verbose", OPT_FLAG, G | C, F(verbose), NO_FIELD, NULL, NULL, 0, 0, false, NULL, false, NULL,
     "print the seed on stderr"},
};
#define N_OPTS (sizeof OPTS / sizeof OPTS[0])

#undef G
#undef C
#undef I
#undef B
#undef P
#undef T
#undef S
#undef F

static bool names(const cli_opt *o, const char *name) {
    return !strcmp(o->name, name) || (o->alias && !strcmp(o->alias, name));
}

/* the row of `name` for sub; NULL if sub does not take it */
static const cli_opt *find(cli_sub sub, const char *name) {
    for (size_t i = 0; i < N_OPTS; i++)
        if ((OPTS[i].subs >> sub & 1u) && names(&OPTS[i], name)) return &OPTS[i];
    return NULL;
}

static bool known_anywhere(const char *name) {
    if (!strcmp(name, "-h") || !strcmp(name, "--help")) return true;
    for (size_t i = 0; i < N_OPTS; i++)
        if (names(&OPTS[i], name)) return true;
    return false;
}

/* text is one of the '|'-separated choices */
static bool in_choices(const char *choices, const char *text) {
    size_t n = strlen(text);
    for (const char *c = choices; *c;) {
        const char *bar = strchr(c, '|');
        size_t len = bar ? (size_t)(bar - c) : strlen(c);
        if (len == n && !strncmp(c, text, n)) return true;
        if (!bar) break;
        c = bar + 1;
    }
    return false;
}

/* Stores the value of option o (written as `opt` on the command line);
 * false after a one-line message. */
static bool store(const cli_opt *o, const char *opt, const char *text, cli_args *a) {
    char *base = (char *)a;
    switch (o->kind) {
    case OPT_FLAG:
        *(bool *)(base + o->field) = true;
        return true;
    case OPT_STR:
        if (!*text && o->meta && !strcmp(o->meta, "FILE")) {
            fprintf(stderr, "kiln: %s needs a file name, got ''\n", opt);
            return false;
        }
        if (o->choices && !in_choices(o->choices, text)) {
            fprintf(stderr, "kiln: %s must be one of %s, got '%s'\n", opt, o->choices, text);
            return false;
        }
        *(const char **)(base + o->field) = text;
        return true;
    case OPT_STOP:
        if (!*text) {      /* the library refuses it too; here it is a usage error before any loading */
            fprintf(stderr, "kiln: %s needs a non-empty text (an empty stop string would match at once)\n", opt);
            return false;
        }
        if (a->n_stop == CLI_MAX_STOP) {
            fprintf(stderr, "kiln: at most %d --stop strings\n", CLI_MAX_STOP);
            return false;
        }
        a->stop[a->n_stop++] = text;
        return true;
    case OPT_INT: {
        int64_t v;
        if (!cli_int("kiln", opt, text, (int64_t)o->lo, (int64_t)o->hi, &v)) return false;
        *(int *)(base + o->field) = (int)v;
        return true;
    }
    case OPT_REAL: {
        double v;
        if (!cli_real("kiln", opt, text, o->lo, o->hi, &v)) return false;
        if (o->lo_open && v == o->lo) {
            fprintf(stderr, "kiln: %s must be above %g and at most %g, got %s\n", opt, o->lo, o->hi, text);
            return false;
        }
        *(float *)(base + o->field) = (float)v;
        return true;
    }
    case OPT_U64: {
        uint64_t v;
        if (!cli_u64("kiln", opt, text, &v)) return false;
        memcpy(base + o->field, &v, sizeof v);
        return true;
    }
    }
    return false;
}

static void set_defaults(cli_sub sub, cli_args *a) {
    /* sampling fields no option sets (penalty_last_n) stay 0 here: the
     * caller takes them from kn_sampler_defaults() */
    memset(a, 0, sizeof *a);
    for (size_t i = 0; i < N_OPTS; i++)
        if ((OPTS[i].subs >> sub & 1u) && OPTS[i].def) (void)store(&OPTS[i], OPTS[i].name, OPTS[i].def, a);
}

static cli_parse_result check_required(cli_sub sub, const cli_args *a) {
    const char *s = SUBS[sub].name;
    for (size_t i = 0; i < N_OPTS; i++) {
        const cli_opt *o = &OPTS[i];
        if (!(o->subs >> sub & 1u) || !o->required || *(const char *const *)((const char *)a + o->field)) continue;
        if (sub == CLI_INFO) fprintf(stderr, "kiln info: no model given: %s\n", SUBS[sub].synopsis);
        else fprintf(stderr, "kiln %s: %s %s is missing (%s; kiln %s --help lists the options)\n", s, o->name, o->meta,
                     SUBS[sub].synopsis, s);
        return CLI_PARSE_USAGE;
    }
    return CLI_PARSE_OK;
}

cli_parse_result cli_parse(cli_sub sub, int argc, char *const *argv, cli_args *a) {
    set_defaults(sub, a);
    if ((unsigned)sub >= CLI_N_SUBS) return CLI_PARSE_USAGE;
    const char *s = SUBS[sub].name;
    for (int i = 0; i < argc; i++) {
        const char *w = argv[i];
        if (!strcmp(w, "-h") || !strcmp(w, "--help")) return CLI_PARSE_HELP;
        if (w[0] != '-' || !w[1]) {
            /* a word that is no option: only `kiln info MODEL` takes one */
            if (sub == CLI_INFO && !a->model) {
                if (!w[0]) { fprintf(stderr, "kiln info: the model's file name is empty\n"); return CLI_PARSE_USAGE; }
                a->model = w;
                continue;
            }
            bool text = sub == CLI_GENERATE || sub == CLI_TOKENIZE;
            fprintf(stderr, "kiln %s: unexpected argument '%s' (%skiln %s --help lists the options)\n", s, w,
                    text ? "quote text with spaces: -p \"...\"; " : "", s);
            return CLI_PARSE_USAGE;
        }
        /* --name=value */
        char name[64];
        const char *inline_val = NULL, *eq = strchr(w, '=');
        if (w[1] == '-' && eq && (size_t)(eq - w) < sizeof name) {
            memcpy(name, w, (size_t)(eq - w));
            name[eq - w] = 0;
            inline_val = eq + 1;
        } else if (strlen(w) < sizeof name) {
            strcpy(name, w);
        } else {
            fprintf(stderr, "kiln: unknown option %.40s... (kiln %s --help lists the options)\n", w, s);
            return CLI_PARSE_USAGE;
        }
        const cli_opt *o = find(sub, name);
        if (!o) {
            if (known_anywhere(name)) fprintf(stderr, "kiln: %s does not apply to kiln %s (kiln %s --help lists its options)\n", name, s, s);
            else fprintf(stderr, "kiln: unknown option %s (kiln %s --help lists the options)\n", name, s);
            return CLI_PARSE_USAGE;
        }
        const char *val = NULL;
        if (o->kind == OPT_FLAG) {
            if (inline_val) { fprintf(stderr, "kiln: %s takes no value, got '%s'\n", name, w); return CLI_PARSE_USAGE; }
        } else if (inline_val) {
            val = inline_val;
        } else if (i + 1 < argc && !(argv[i + 1][0] == '-' && known_anywhere(argv[i + 1]))) {
            val = argv[++i];
        } else {
            /* the last word, or followed by another option (`-m -p hi`) */
            fprintf(stderr, "kiln: %s needs a value: %s %s\n", name, name, o->meta);
            return CLI_PARSE_USAGE;
        }
        if (!store(o, name, val, a)) return CLI_PARSE_USAGE;
        if (o->given != NO_FIELD) *(bool *)((char *)a + o->given) = true;
    }
    if (sub == CLI_GENERATE && !a->chat && (a->system || a->tmpl)) {
        /* they shape the chat template, which only --chat applies */
        fprintf(stderr, "kiln generate: %s applies with --chat (add --chat, or leave it out)\n", a->system ? "--system" : "--chat-template");
        return CLI_PARSE_USAGE;
    }
    return check_required(sub, a);
}

/* ---- help ------------------------------------------------------------------------ */
/* text from column `indent`, wrapped at spaces before column 100 */
static void wrapped(const char *text, int indent, FILE *f) {
    const int width = indent < 60 ? 100 - indent : 40;
    while ((int)strlen(text) > width) {
        int cut = width;
        while (cut > 0 && text[cut] != ' ') cut--;
        if (cut == 0) break;                        /* one long word: leave it whole */
        fprintf(f, "%.*s\n%*s", cut, text, indent, "");
        text += cut + 1;
    }
    fprintf(f, "%s\n", text);
}

static void help_line(const cli_opt *o, FILE *f) {
    char head[64], desc[512];
    const char *meta = o->meta ? o->meta : "";
    if (o->alias) snprintf(head, sizeof head, "%s, %s %s", o->name, o->alias, meta);
    else snprintf(head, sizeof head, "%s %s", o->name, meta);
    const char *def = o->def ? o->def : o->shown;
    int n = snprintf(desc, sizeof desc, "%s", o->help);
    size_t k = n > 0 && (size_t)n < sizeof desc ? (size_t)n : 0;
    if (o->required) snprintf(desc + k, sizeof desc - k, " (required)");
    else if (o->kind == OPT_INT)
        snprintf(desc + k, sizeof desc - k, " (%" PRId64 " to %" PRId64 "; default %s)", (int64_t)o->lo, (int64_t)o->hi, def);
    else if (o->kind == OPT_REAL && o->lo_open) snprintf(desc + k, sizeof desc - k, " (above %g, at most %g; default %s)", o->lo, o->hi, def);
    else if (o->kind == OPT_REAL) snprintf(desc + k, sizeof desc - k, " (%g to %g; default %s)", o->lo, o->hi, def);
    else if (def) snprintf(desc + k, sizeof desc - k, " (default: %s)", def);
    fprintf(f, "  %-28s ", head);
    wrapped(desc, 31, f);
}

void cli_help(cli_sub sub, FILE *f) {
    if ((unsigned)sub >= CLI_N_SUBS) return;
    fprintf(f, "usage: %s\n%s\n\noptions:\n", SUBS[sub].synopsis, SUBS[sub].what);
    for (size_t i = 0; i < N_OPTS; i++)
        if (OPTS[i].subs >> sub & 1u) help_line(&OPTS[i], f);
    fprintf(f, "  %-28s %s\n", "-h, --help", "this help");
    fputc('\n', f);
    if (sub == CLI_GENERATE || sub == CLI_CHAT)
        fprintf(f, "The seed is random unless --seed is given; -v prints it, and --seed with that number repeats the run.\n");
    fprintf(f, "Long options also take --name=VALUE. Exit status: 0 ok, 1 error, 2 usage.\n");
}

const char *cli_sub_what(cli_sub sub) {
    return (unsigned)sub < CLI_N_SUBS ? SUBS[sub].what : "";
}

void cli_wrapped(const char *text, int indent, FILE *f) { wrapped(text, indent, f); }
