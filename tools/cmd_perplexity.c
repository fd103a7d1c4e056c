/* cmd_perplexity.c: kiln perplexity, the perplexity of a text under a model.
 *
 * The text (-f FILE, or - for stdin; pipes work) is read to its end,
 * tokenized as the model asks (BOS only when its tokenizer adds one) and
 * scored with llama.cpp's windows (kn_model_perplexity): by default windows
 * of --ctx tokens side by side, each scoring its second half; with --stride N
 * windows every N tokens scoring their last N. The number matches
 * llama-perplexity on the same model, text, context and stride.
 */
#include "cli.h"
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The whole of f, NUL-terminated, read in blocks (no size asked of the
 * file: pipes and /dev/stdin work). NULL after a message. */
static char *read_all(FILE *f, const char *name, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) { fprintf(stderr, "kiln perplexity: out of memory\n"); return NULL; }
    for (;;) {
        if (cap - n < 2) {
            char *b = cap < ((size_t)1 << 40) ? realloc(buf, cap * 2) : NULL;
            if (!b) { free(buf); fprintf(stderr, "kiln perplexity: %s is too large to hold in memory\n", name); return NULL; }
            buf = b; cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
    }
    if (ferror(f)) {
        fprintf(stderr, "kiln perplexity: cannot read %s: %s\n", name, strerror(errno));
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

/* -f FILE or - (stdin); NULL after a message. The file is opened without
 * blocking, so a named FIFO nobody writes to reads as empty instead of
 * hanging; pipes (/dev/stdin, <(cmd)) and regular files are read to the end. */
static char *read_text(const char *path, size_t *len) {
    bool std_in = !strcmp(path, "-");
    int fd = std_in ? 0 : open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) { fprintf(stderr, "kiln perplexity: cannot open %s: %s\n", path, strerror(errno)); return NULL; }
    struct stat sb;
    if (fstat(fd, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "kiln perplexity: %s is a directory; give a text file (-f FILE)\n", path);
        if (!std_in) close(fd);
        return NULL;
    }
    if (!std_in) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    FILE *f = std_in ? stdin : fdopen(fd, "rb");
    if (!f) { fprintf(stderr, "kiln perplexity: cannot read %s: %s\n", path, strerror(errno)); close(fd); return NULL; }
    char *text = read_all(f, std_in ? "standard input" : path, len);
    if (!std_in) fclose(f);
    return text;
}

/* all the tokens of text (BOS as the tokenizer asks, no special-token parsing:
 * as llama.cpp's perplexity); NULL after a message */
static int32_t *tokenize_all(const kn_tokenizer *tok, const char *text, size_t len, int *n) {
    if (len > (size_t)1 << 30) { fprintf(stderr, "kiln perplexity: the text is over 1 GiB; split it\n"); return NULL; }
    int cap = (int)len + 8;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)cap);
    kn_status st = ids ? kn_tokenize(tok, text, len, kn_tokenizer_add_bos(tok), false, ids, cap, n) : KN_ERR_NOMEM;
    if (st == KN_ERR_LIMIT) {
        int32_t *b = realloc(ids, sizeof(int32_t) * (size_t)*n);
        if (b) { ids = b; cap = *n; st = kn_tokenize(tok, text, len, kn_tokenizer_add_bos(tok), false, ids, cap, n); }
        else st = KN_ERR_NOMEM;
    }
    if (st) {
        fprintf(stderr, "kiln perplexity: %s\n", st == KN_ERR_NOMEM ? "out of memory" : kn_last_error());
        free(ids);
        return NULL;
    }
    return ids;
}

/* windows done, on a terminal only */
static bool show_windows(void *ud, int done, int total) {
    (void)ud;
    static int tty = -1;
    if (tty < 0) tty = isatty(2);
    if (tty) { fprintf(stderr, done < total ? "\rwindow %d/%d" : "\r\033[K", done, total); fflush(stderr); }
    return true;
}

int cmd_perplexity(const cli_args *a) {
    if (!a->file) { fprintf(stderr, "kiln perplexity: no text file (-f FILE, or -f - for stdin)\n"); return 2; }
    size_t len = 0;
    char *text = read_text(a->file, &len);
    if (!text) return 1;
    kn_model *m = cli_load(a);
    if (!m) { free(text); return 1; }
    const kn_tokenizer *tok = kn_model_tokenizer(m);
    int rc = 1, n = 0;
    int32_t *ids = NULL;
    if (!tok) fprintf(stderr, "kiln perplexity: the model has no tokenizer; give one with -z FILE\n");
    else if ((ids = tokenize_all(tok, text, len, &n))) {
        kn_perplexity_params pp = {.stride = a->stride, .progress = show_windows};
        kn_perplexity_result r;
        double t0 = cli_now_s();
        kn_status st = kn_model_perplexity(m, ids, n, &pp, &r);
        if (st) fprintf(stderr, "kiln %s\n", kn_last_error());
        else {
            printf("perplexity: %.4f over %ld tokens (%.4f nats/token)\n", r.ppl, r.count, r.nll / (double)r.count);
            fprintf(stderr, "%d tokens in the text, context %d, stride %d, %d windows, %.1f s\n", n, kn_model_n_ctx(m),
                    a->stride, r.n_windows, cli_now_s() - t0);
            rc = 0;
        }
    }
    free(ids); free(text);
    kn_model_free(m);
    return rc;
}
