/* kiln_train.h: a training loop around one compiled step plan: progress
 * line (loss, samples or tokens/s, ETA), periodic evaluation and text
 * samples through callbacks, checkpoints every N steps, Ctrl-C (SIGINT)
 * saves a checkpoint before returning, and resume that continues with the
 * same loss sequence bit for bit.
 *
 *   kn_trainer_cfg c = kn_trainer_defaults();
 *   c.step = plan; c.loss = loss; c.opt = opt; c.model = net;   // plan: loss + kn_optim_build effects
 *   c.steps = 1000; c.items_per_step = B * T; c.items_name = "tok";
 *   c.load_batch = my_batch;             // writes the plan inputs of step s (a pure function of s)
 *   c.lr_at = my_lr;                     // learning rate of step s
 *   c.eval = my_eval; c.eval_every = 200; c.ckpt_path = "run.safetensors"; c.ckpt_every = 500;
 *   c.ud = &state;
 *   int64_t start = 0;
 *   if (resume) kn_train_load("run.safetensors", net, opt, 0, NULL, &start);
 *   kn_train_catch_sigint(true);
 *   kn_train_result r;
 *   if (kn_train_run(&c, start, &r)) fprintf(stderr, "%s\n", kn_last_error());
 *
 * Bit-exact resume rests on three things the caller provides: the batch of
 * step s depends on s only (seek a kn_loader with kn_loader_seek, or draw
 * windows from a hash of (seed, s)); the learning rate is a function of s;
 * and nothing else carries state between steps (no dropout stream other
 * than one keyed by the step). The checkpoint holds every parameter and
 * buffer of the model, every optimizer state tensor and the step count.
 *
 * Checkpoint names: the model's dotted names ("h.0.attn.c_attn.weight"),
 * optimizer state as "optim.<state>.<param name>" ("optim.exp_avg.wte.weight"),
 * metadata "step" (with a loss scaler also "loss_scale" and
 * "loss_scale_good_steps", restored by kn_train_load when present), plus
 * the caller's (key, value) pairs, which kn_train_load compares so that a
 * checkpoint of another model is refused with a message naming the key.
 *
 * Mixed precision is the model's and optimizer's business (kiln_nn.h:
 * kn_module_set_precision, kn_optim_set_loss_scaler); when the optimizer has
 * a loss scaler the loop calls kn_loss_scaler_update after every run and
 * counts the skipped steps.
 *
 * Non-goals: gradient accumulation inside the loop
 * (build it into the step plan).
 */
#ifndef KILN_TRAIN_H
#define KILN_TRAIN_H
#pragma GCC visibility push(default)   /* what libkiln.so exports: the kn_ API (the rest is built -fvisibility=hidden) */
#include "kiln_nn.h"
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kn_trainer_cfg {
    kn_plan *step;              /* forward + backward + update, compiled once          */
    kn_tensor *loss;            /* scalar output of step                               */
    kn_optim *opt;              /* its optimizer (prepare is called before each run)   */
    kn_module *model;           /* for checkpoints                                     */
    int64_t steps;              /* run until this step count (exclusive, 0-based)      */
    int64_t items_per_step;     /* samples or tokens per step, for the rate            */
    const char *items_name;     /* "samples", "tok" (default "items")                  */
    void *ud;                   /* passed to every callback                            */
    /* Write the plan inputs for step s. Required. */
    kn_status (*load_batch)(void *ud, int64_t step);
    /* Learning rate of step s (every group); NULL keeps the optimizer's. */
    double (*lr_at)(void *ud, int64_t step);
    /* Called after step s when (s+1) % eval_every == 0 and after the last
     * step; prints what it wants (on the log) and may return a metric. */
    kn_status (*eval)(void *ud, int64_t step, double *metric);
    kn_status (*sample)(void *ud, int64_t step);     /* same schedule with sample_every */
    /* Called after every step with its loss (e.g. to record the sequence). */
    void (*on_step)(void *ud, int64_t step, double loss);
    int64_t eval_every, sample_every, ckpt_every;    /* 0: never (eval/sample: at the end only) */
    int64_t log_every;          /* progress line every N steps when the log is not a tty (default 10) */
    const char *ckpt_path;      /* NULL: no checkpoints (and Ctrl-C saves nothing)     */
    int n_meta;                 /* (key, value) string pairs saved with each checkpoint */
    const char *const *meta_kv;
    FILE *log;                  /* progress and messages (NULL = stderr)               */
    bool quiet;                 /* no progress line                                    */
    /* Data parallel (kiln_dist.h; the optimizer got kn_optim_set_dist): the
     * loss reported is the mean over ranks, a stop (Ctrl-C on any rank) ends
     * every rank after the same step, and only rank 0 logs, evaluates,
     * samples and writes checkpoints (the replicas are equal). NULL: one process. */
    kn_dist *dist;
} kn_trainer_cfg;

kn_trainer_cfg kn_trainer_defaults(void);

typedef struct kn_train_result {
    int64_t next_step;          /* first step not run (== steps when finished)          */
    double last_loss;           /* loss of the last step run (NaN if none)              */
    double seconds;             /* wall time of the loop                               */
    double items_per_s;         /* over the steps run (evaluation time excluded)       */
    bool interrupted;           /* stopped by SIGINT / kn_train_request_stop            */
    int64_t skipped_steps;      /* updates skipped by the loss scaler (f16 overflow)    */
} kn_train_result;

/* Runs steps start_step .. cfg->steps-1. Stops early (saving a checkpoint
 * when ckpt_path is set) after the step during which SIGINT arrived or
 * kn_train_request_stop was called; res->interrupted tells. A non-finite
 * loss stops with KN_ERR_STATE naming the step. */
kn_status kn_train_run(const kn_trainer_cfg *cfg, int64_t start_step, kn_train_result *res);

/* SIGINT handling: on = install a handler that only sets the stop flag
 * (a second Ctrl-C restores the default action, so a third one kills);
 * off = restore the previous handler. */
void kn_train_catch_sigint(bool on);
void kn_train_request_stop(void);     /* same as a Ctrl-C (async-signal-safe)  */
bool kn_train_stop_requested(void);
void kn_train_clear_stop(void);

/* Checkpoint of the model (params + buffers), the optimizer state (may be
 * NULL) and `step` (the number of steps done), with metadata pairs. With
 * ZeRO-1 (kn_optim_set_zero1) every rank must call it: each sends the
 * states it keeps, rank 0 writes the one file (a file like any other: it
 * loads on any number of ranks, or none). */
kn_status kn_train_save(const char *path, kn_module *m, kn_optim *o, int64_t step, int n_meta,
                        const char *const meta_kv[]);
/* Load what kn_train_save wrote into m and o (o may be NULL: the optimizer
 * state in the file is then ignored), set the optimizer's step count and
 * return the step in *step. Each given metadata pair must be present with the
 * same value, else KN_ERR_INVALID naming the key, the file's value and
 * ours; name/shape differences are listed as kn_ckpt_load does. Nothing is
 * written into the tensors on any error. */
kn_status kn_train_load(const char *path, kn_module *m, kn_optim *o, int n_meta, const char *const meta_kv[],
                        int64_t *step);

/* "1h02m", "3m05s", "12s" into buf (cap >= 16). */
const char *kn_train_fmt_duration(double seconds, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif
