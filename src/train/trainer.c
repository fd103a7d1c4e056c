/* trainer.c: the training loop of kiln_train.h (progress, evaluation and
 * sample callbacks, checkpoints, SIGINT) and the checkpoint layout of a
 * model + optimizer.
 *
 * The loop only orchestrates: the step itself is the caller's compiled plan
 * (forward, backward and optimizer update in one), replayed once per step.
 * Non-goals: deciding batches or schedules (callbacks do), retrying failed
 * steps. */
#include "kiln_train.h"
#include "kiln_ckpt.h"
#include "kiln_dist.h"
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- stop flag and SIGINT ------------------------------------------------------ */

static volatile sig_atomic_t g_stop;
static volatile sig_atomic_t g_hits;
static struct sigaction g_old;
static bool g_installed;

static void on_sigint(int sig) {
    (void)sig;
    g_stop = 1;
    if (++g_hits >= 2) {            /* second Ctrl-C: the next one kills as usual */
        struct sigaction d;
        memset(&d, 0, sizeof d);
        d.sa_handler = SIG_DFL;
        sigaction(SIGINT, &d, NULL);
    }
}

void kn_train_catch_sigint(bool on) {
    if (on && !g_installed) {
        struct sigaction a;
        memset(&a, 0, sizeof a);
        a.sa_handler = on_sigint;
        sigemptyset(&a.sa_mask);
        if (sigaction(SIGINT, &a, &g_old) == 0) g_installed = true;
        g_hits = 0;
    } else if (!on && g_installed) {
        sigaction(SIGINT, &g_old, NULL);
        g_installed = false;
    }
}
void kn_train_request_stop(void) { g_stop = 1; }
bool kn_train_stop_requested(void) { return g_stop != 0; }
void kn_train_clear_stop(void) { g_stop = 0; g_hits = 0; }

/* ---- checkpoints ------------------------------------------------------------------- */

static const char *const k_states[] = {"exp_avg", "exp_avg_sq", "momentum_buffer", "square_avg", "grad_avg", "sum"};
#define N_STATES (int)(sizeof k_states / sizeof k_states[0])

typedef struct ck_list { int64_t n; char **names; kn_tensor **ts; } ck_list;

/* the optimizer keeps a state slot of this name for its parameters */
static bool state_kept(const kn_optim *o, const char *name) {
    const char *names[8];
    int n = kn_optim_state_names(o, names, 8);
    for (int i = 0; i < n && i < 8; i++) if (!strcmp(names[i], name)) return true;
    return false;
}

/* ZeRO-1 (kn_optim_set_zero1): the states other ranks keep, as host
 * tensors of their own context, t[i * N_STATES + s] for parameter i and
 * slot k_states[s]; NULL where this rank keeps the state or there is none. */
typedef struct standins { kn_ctx *ctx; kn_tensor **t; } standins;

static void standins_free(standins *sd) { kn_ctx_free(sd->ctx); free(sd->t); memset(sd, 0, sizeof *sd); }
static kn_status standins_new(const kn_optim *o, standins *sd) {
    sd->ctx = kn_ctx_new(&(kn_ctx_opts){kn_backend_cpu()});
    sd->t = calloc((size_t)kn_optim_n_params(o) * N_STATES + 1, sizeof *sd->t);
    if (!sd->ctx || !sd->t) { standins_free(sd); return kn_set_error(KN_ERR_NOMEM, "checkpoint: out of memory"); }
    return KN_OK;
}

/* Loading: every rank reads the whole file; the states others keep land in
 * empty stand-ins. */
static kn_status standins_for_load(const kn_optim *o, standins *sd) {
    kn_status st = standins_new(o, sd);
    for (int i = 0; !st && i < kn_optim_n_params(o); i++) {
        kn_tensor *p = kn_optim_param(o, i);
        for (int s = 0; !st && s < N_STATES; s++)
            if (state_kept(o, k_states[s]) && !kn_optim_state(o, i, k_states[s]) &&
                !(sd->t[i * N_STATES + s] = kn_empty(sd->ctx, KN_F32, p->ndim, p->shape)))
                st = kn_set_error(KN_ERR_NOMEM, "checkpoint: out of memory");
    }
    if (st) standins_free(sd);
    return st;
}

/* Saving: each state's owner sends it (the host control channel), and rank
 * 0, which writes the file, keeps the ones it does not own as stand-ins.
 * Every rank walks the same states in the same order; an owner that cannot
 * read one still sends (zeros), and at the end the ranks agree whether any
 * failed, so that rank 0 writes no file with a hole in it. The other ranks'
 * sd stays empty. */
static kn_status ck_gather_states(kn_optim *o, standins *sd) {
    kn_dist *d = kn_optim_get_dist(o);
    int me = kn_dist_rank(d), no = kn_optim_n_params(o);
    kn_status st = standins_new(o, sd), err = KN_OK;   /* st: the channel; err: this rank's first failure */
    for (int i = 0; i < no && !st; i++) {
        kn_tensor *p = kn_optim_param(o, i);
        int own = kn_optim_state_owner(o, i);
        for (int s = 0; s < N_STATES && !st; s++) {
            if (own < 0 || !state_kept(o, k_states[s])) continue;
            size_t bytes = sizeof(float) * (size_t)kn_numel(p);
            float *buf = calloc(1, bytes ? bytes : 1);   /* without it this rank leaves; the others time out */
            if (!buf) {
                standins_free(sd);
                return kn_set_error(KN_ERR_NOMEM, "checkpoint: out of memory gathering the optimizer states");
            }
            kn_status rs = own == me ? kn_tensor_read(kn_optim_state(o, i, k_states[s]), buf, KN_F32) : KN_OK;
            if (rs) memset(buf, 0, bytes);
            if (rs && !err) err = rs;
            st = kn_dist_broadcast_host(d, buf, bytes, own);
            if (!st && me == 0 && own != 0 && !err &&
                !(sd->t[i * N_STATES + s] = kn_from_data(sd->ctx, KN_F32, p->ndim, p->shape, buf)))
                err = kn_set_error(KN_ERR_NOMEM, "checkpoint: out of memory gathering the optimizer states");
            free(buf);
        }
    }
    double bad = err ? 1 : 0;
    if (!st) st = kn_dist_all_reduce_host(d, KN_F64, &bad, 1, KN_DIST_MAX);
    if (!st && err) st = err;
    if (!st && bad > 0) st = kn_set_error(KN_ERR_STATE, "checkpoint: another rank could not send its optimizer states (see "
                                          "its output); nothing was written");
    if (st) standins_free(sd);
    return st;
}

static void ck_free(ck_list *l) {
    for (int64_t i = 0; i < l->n; i++) free(l->names[i]);
    free(l->names); free(l->ts);
    memset(l, 0, sizeof *l);
}

/* Every tensor a checkpoint of (m, o) holds, with its name; under ZeRO-1
 * the states other ranks keep are sd's stand-ins (sd NULL: none). */
static kn_status ck_collect(kn_module *m, kn_optim *o, ck_list *l, const standins *sd) {
    memset(l, 0, sizeof *l);
    if (!m) return kn_set_error(KN_ERR_INVALID, "checkpoint: model is NULL");
    int np = kn_module_named_params(m, true, NULL, 0);
    kn_named_param *ps = calloc((size_t)(np > 0 ? np : 1), sizeof *ps);
    int no = o ? kn_optim_n_params(o) : 0;
    int64_t cap = np + (int64_t)no * N_STATES;
    l->names = calloc((size_t)(cap > 0 ? cap : 1), sizeof *l->names);
    l->ts = calloc((size_t)(cap > 0 ? cap : 1), sizeof *l->ts);
    if (!ps || !l->names || !l->ts) { free(ps); ck_free(l); return kn_set_error(KN_ERR_NOMEM, "checkpoint: out of memory"); }
    kn_module_named_params(m, true, ps, np);
    for (int i = 0; i < np; i++) {
        l->names[l->n] = strdup(ps[i].name);
        l->ts[l->n++] = ps[i].t;
    }
    for (int i = 0; i < no; i++) {
        kn_tensor *p = kn_optim_param(o, i);
        const char *pname = NULL;
        for (int k = 0; k < np && !pname; k++) if (ps[k].t == p) pname = ps[k].name;
        char fallback[32];
        if (!pname) { snprintf(fallback, sizeof fallback, "param%d", i); pname = fallback; }
        for (int s = 0; s < N_STATES; s++) {
            kn_tensor *st = kn_optim_state(o, i, k_states[s]);
            if (!st && sd && sd->t) st = sd->t[i * N_STATES + s];
            if (!st) continue;
            size_t len = strlen(pname) + strlen(k_states[s]) + 8;
            char *nm = malloc(len);
            if (!nm) { free(ps); ck_free(l); return kn_set_error(KN_ERR_NOMEM, "checkpoint: out of memory"); }
            snprintf(nm, len, "optim.%s.%s", k_states[s], pname);
            l->names[l->n] = nm;
            l->ts[l->n++] = st;
        }
    }
    free(ps);
    for (int64_t i = 0; i < l->n; i++)
        if (!l->names[i]) { ck_free(l); return kn_set_error(KN_ERR_NOMEM, "checkpoint: out of memory"); }
    return KN_OK;
}

kn_status kn_train_save(const char *path, kn_module *m, kn_optim *o, int64_t step, int n_meta,
                        const char *const meta_kv[]) {
    if (!path) return kn_set_error(KN_ERR_INVALID, "kn_train_save: path is NULL");
    if (n_meta < 0 || (n_meta > 0 && !meta_kv)) return kn_set_error(KN_ERR_INVALID, "kn_train_save: bad metadata");
    standins sd = {0};
    if (kn_optim_state_owner(o, 0) >= 0) {       /* ZeRO-1: every rank sends, rank 0 writes */
        kn_status st = ck_gather_states(o, &sd);
        if (st || kn_dist_rank(kn_optim_get_dist(o)) != 0) { standins_free(&sd); return st; }
    }
    ck_list l;
    kn_status st = ck_collect(m, o, &l, &sd);
    if (st) { standins_free(&sd); return st; }
    const char **kv = malloc(sizeof *kv * (size_t)(2 * n_meta + 6));
    if (!kv) { ck_free(&l); standins_free(&sd); return kn_set_error(KN_ERR_NOMEM, "kn_train_save: out of memory"); }
    char sbuf[32], scale[40], good[32];
    snprintf(sbuf, sizeof sbuf, "%lld", (long long)step);
    kv[0] = "step"; kv[1] = sbuf;
    for (int i = 0; i < 2 * n_meta; i++) kv[2 + i] = meta_kv[i];
    int nkv = n_meta + 1;
    kn_loss_scaler *sc = kn_optim_loss_scaler(o);
    if (sc) {              /* f16: the loss scale, so that a resumed run continues bit for bit */
        double s; int64_t g;
        kn_loss_scaler_get_state(sc, &s, &g);
        snprintf(scale, sizeof scale, "%.17g", s);
        snprintf(good, sizeof good, "%lld", (long long)g);
        kv[2 * nkv] = "loss_scale"; kv[2 * nkv + 1] = scale;
        kv[2 * nkv + 2] = "loss_scale_good_steps"; kv[2 * nkv + 3] = good;
        nkv += 2;
    }
    st = kn_ckpt_save(path, l.n, (const char *const *)l.names, l.ts, nkv, kv);
    free(kv);
    ck_free(&l);
    standins_free(&sd);
    return st;
}

kn_status kn_train_load(const char *path, kn_module *m, kn_optim *o, int n_meta, const char *const meta_kv[],
                        int64_t *step) {
    if (!path) return kn_set_error(KN_ERR_INVALID, "kn_train_load: path is NULL");
    if (access(path, R_OK) != 0)
        return kn_set_error(KN_ERR_IO, "checkpoint '%s' cannot be read (missing file?); check the path", path);
    char val[256];
    kn_status st = kn_ckpt_meta(path, "step", val, sizeof val);
    if (st) {
        if (st == KN_ERR_INVALID)
            return kn_set_error(KN_ERR_FORMAT, "checkpoint '%s' has no \"step\" metadata: it was not written by "
                                "kn_train_save (kiln train)", path);
        return st;
    }
    char *end;
    long long s = strtoll(val, &end, 10);
    if (*end || s < 0) return kn_set_error(KN_ERR_FORMAT, "checkpoint '%s': bad step \"%s\"", path, val);
    for (int i = 0; i < n_meta; i++) {
        const char *k = meta_kv[2 * i], *want = meta_kv[2 * i + 1];
        st = kn_ckpt_meta(path, k, val, sizeof val);
        if (st == KN_ERR_INVALID)
            return kn_set_error(KN_ERR_INVALID, "checkpoint '%s' lacks \"%s\" (expected \"%s\"): it belongs to "
                                "another kind of model or run", path, k, want);
        if (st) return st;
        if (strcmp(val, want))
            return kn_set_error(KN_ERR_INVALID, "checkpoint '%s' does not match this model: %s is \"%s\" in the file "
                                "but \"%s\" here; use the same options as the run that wrote it", path, k, val, want);
    }
    standins sd = {0};
    if (kn_optim_state_owner(o, 0) >= 0 && (st = standins_for_load(o, &sd))) return st;   /* ZeRO-1 */
    ck_list l;
    st = ck_collect(m, o, &l, &sd);
    if (!st) {
        st = kn_ckpt_load_ex(path, l.n, (const char *const *)l.names, l.ts, o ? KN_CKPT_STRICT : KN_CKPT_ALLOW_UNEXPECTED);
        ck_free(&l);
    }
    standins_free(&sd);
    if (st) return st;
    if (o && (st = kn_optim_set_step_count(o, (int64_t)s))) return st;
    kn_loss_scaler *sc = kn_optim_loss_scaler(o);
    if (sc && kn_ckpt_meta(path, "loss_scale", val, sizeof val) == KN_OK) {   /* absent: an f32/bf16 run's file */
        char gv[32] = "0";
        kn_ckpt_meta(path, "loss_scale_good_steps", gv, sizeof gv);
        if ((st = kn_loss_scaler_set_state(sc, strtod(val, NULL), strtoll(gv, NULL, 10)))) return st;
    }
    if (step) *step = (int64_t)s;
    return KN_OK;
}

/* ---- the loop ------------------------------------------------------------------------ */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *kn_train_fmt_duration(double sec, char *buf, size_t cap) {
    if (!(sec >= 0) || sec > 1e8) { snprintf(buf, cap, "?"); return buf; }
    long long t = (long long)(sec + 0.5);
    if (t >= 3600) snprintf(buf, cap, "%lldh%02lldm", t / 3600, (t / 60) % 60);
    else if (t >= 60) snprintf(buf, cap, "%lldm%02llds", t / 60, t % 60);
    else snprintf(buf, cap, "%llds", t);
    return buf;
}

kn_trainer_cfg kn_trainer_defaults(void) {
    kn_trainer_cfg c;
    memset(&c, 0, sizeof c);
    c.items_name = "items";
    c.log_every = 10;
    return c;
}

static void progress(const kn_trainer_cfg *c, FILE *f, bool tty, int64_t s, double loss, double lr, double rate,
                     double eta) {
    char eb[32];
    int64_t done = s + 1, total = c->steps;
    if (tty) {
        enum { W = 24 };
        char bar[W + 1];
        int fill = total > 0 ? (int)((double)done * W / (double)total) : W;
        for (int i = 0; i < W; i++) bar[i] = i < fill ? '=' : (i == fill ? '>' : ' ');
        bar[W] = 0;
        fprintf(f, "\r[%s] %lld/%lld loss %.4f lr %.2e %.0f %s/s ETA %s   ", bar, (long long)done, (long long)total, loss,
                lr, rate, c->items_name, kn_train_fmt_duration(eta, eb, sizeof eb));
    } else {
        fprintf(f, "step %lld/%lld loss %.4f lr %.2e %.0f %s/s ETA %s\n", (long long)done, (long long)total, loss, lr,
                rate, c->items_name, kn_train_fmt_duration(eta, eb, sizeof eb));
    }
    fflush(f);
}

static bool due(int64_t every, int64_t s, int64_t last) { return (every > 0 && (s + 1) % every == 0) || s == last; }

kn_status kn_train_run(const kn_trainer_cfg *c, int64_t start, kn_train_result *res) {
    kn_train_result r = {.next_step = start, .last_loss = NAN};
    if (res) *res = r;
    if (!c || !c->step || !c->loss || !c->opt || !c->load_batch)
        return kn_set_error(KN_ERR_INVALID, "kn_train_run: cfg needs step, loss, opt and load_batch");
    if (start < 0 || start > c->steps)
        return kn_set_error(KN_ERR_INVALID, "kn_train_run: start step %lld outside 0..%lld", (long long)start,
                            (long long)c->steps);
    FILE *f = c->log ? c->log : stderr;
    bool tty = isatty(fileno(f));
    int64_t log_every = c->log_every > 0 ? c->log_every : 10;
    double t0 = now_s(), train_time = 0;
    int64_t steps_timed = 0;
    kn_status st = KN_OK;
    bool line_open = false;
    kn_loss_scaler *scaler = kn_optim_loss_scaler(c->opt);   /* f16: skip-and-backoff after each run */
    bool lead = kn_dist_rank(c->dist) == 0, multi = kn_dist_world(c->dist) > 1;
    bool quiet = c->quiet || !lead;
    for (int64_t s = start; s < c->steps; s++) {
        double ts = now_s();
        if ((st = c->load_batch(c->ud, s))) break;
        double lr = c->lr_at ? c->lr_at(c->ud, s) : kn_optim_get_lr(c->opt, 0);
        if (c->lr_at) kn_optim_set_lr(c->opt, -1, lr);
        if ((st = kn_optim_prepare(c->opt))) break;
        if ((st = kn_plan_run(c->step))) break;
        bool skipped = false;
        if (scaler && (st = kn_loss_scaler_update(scaler, &skipped))) break;
        if (skipped) r.skipped_steps++;
        double loss = kn_item(c->loss);
        if (multi && (st = kn_dist_all_reduce_host(c->dist, KN_F64, &loss, 1, KN_DIST_AVG))) break;   /* the mean loss */
        train_time += now_s() - ts;
        steps_timed++;
        r.next_step = s + 1;
        r.last_loss = loss;
        if (c->on_step) c->on_step(c->ud, s, loss);
        if (!isfinite(loss)) {
            st = kn_set_error(KN_ERR_STATE, "training diverged: loss is %g at step %lld; lower the learning rate", loss,
                              (long long)s);
            break;
        }
        double per = train_time / (double)steps_timed;
        double rate = (double)c->items_per_step / per;
        if (!quiet && (tty || (s + 1) % log_every == 0 || s == c->steps - 1)) {
            progress(c, f, tty, s, loss, lr, rate, per * (double)(c->steps - s - 1));
            line_open = tty;
        }
        bool stop = kn_train_stop_requested();
        if (multi) {          /* a stop on any rank (Ctrl-C reaches them at different steps) stops all after this one */
            double v = stop ? 1 : 0;
            if ((st = kn_dist_all_reduce_host(c->dist, KN_F64, &v, 1, KN_DIST_MAX))) break;
            stop = v > 0;
        }
        bool last = s == c->steps - 1;
        bool save = c->ckpt_path && ((c->ckpt_every > 0 && (s + 1) % c->ckpt_every == 0) || last || stop);
        if (!lead) {
            /* ZeRO-1: the optimizer states this rank keeps go to rank 0's file */
            if (save && kn_optim_state_owner(c->opt, 0) >= 0 &&
                (st = kn_train_save(c->ckpt_path, c->model, c->opt, s + 1, c->n_meta, c->meta_kv)))
                break;
            if (stop) { r.interrupted = true; break; }
            continue;
        }
        if (c->eval && due(c->eval_every, s, c->steps - 1)) {
            if (line_open) { fputc('\n', f); line_open = false; }
            double metric;
            if ((st = c->eval(c->ud, s, &metric))) break;
        }
        if (c->sample && due(c->sample_every, s, c->steps - 1)) {
            if (line_open) { fputc('\n', f); line_open = false; }
            if ((st = c->sample(c->ud, s))) break;
        }
        if (save) {
            if ((st = kn_train_save(c->ckpt_path, c->model, c->opt, s + 1, c->n_meta, c->meta_kv))) break;
            if (stop || last) {
                if (line_open) { fputc('\n', f); line_open = false; }
                fprintf(f, "checkpoint: %s (step %lld)\n", c->ckpt_path, (long long)(s + 1));
            }
        }
        if (stop) {
            if (line_open) { fputc('\n', f); line_open = false; }
            fprintf(f, "stopped after step %lld of %lld%s\n", (long long)(s + 1), (long long)c->steps,
                    c->ckpt_path ? "; resume with the checkpoint" : "");
            r.interrupted = true;
            break;
        }
    }
    if (line_open) fputc('\n', f);
    r.seconds = now_s() - t0;
    r.items_per_s = train_time > 0 ? (double)c->items_per_step * (double)steps_timed / train_time : 0;
    if (res) *res = r;
    return st;
}
