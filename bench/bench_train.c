/* bench_train.c: training throughput, kiln vs PyTorch CPU in the same run.
 *
 *   mlp  784-512-256-10 ReLU MLP, batch 128, cross-entropy, AdamW   samples/s
 *   gpt  GPT-2 architecture V=256 T=64 C=128 L=4 H=4, batch 8, AdamW  tokens/s
 *
 * Each kiln step is one replayed plan (forward + backward + AdamW update).
 * The PyTorch side is scripts/bench_train_torch.py with the same model,
 * batch and thread count (torch.set_num_threads = kiln's pool size) at its
 * best: fused AdamW, and torch.compile too with -c (the faster of eager and
 * compiled counts). It runs when `python3 -c "import torch"` works after
 * sourcing scripts/torch_env.sh, else its column says n/a with the reason.
 * kiln and PyTorch alternate for -r rounds; the table gives the medians and
 * each round's numbers (a shared VM drifts by 10-20 % within minutes).
 * Run from the repository root.
 *
 * Options: -t N threads (default: the pool's), -s N timed steps (default 20),
 * -r N rounds (default 3), -c also torch.compile, -m mlp|gpt one model alone
 * without PyTorch (with KN_PROFILE=1: where time goes).
 */
#include "kn_bench.h"         /* kn_bench_now, kn_bench_cmp_double */
#include "kiln.h"
#include "kiln_nn.h"
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Build loss + AdamW effects as one plan and time `steps` runs after 3 warm-up runs. */
static double time_steps(kn_ctx *ctx, kn_module *m, kn_tensor *loss, double wd, int steps) {
    if (!loss || kn_backward(ctx, loss)) return -1;
    kn_optim_cfg oc = kn_optim_defaults(KN_OPTIM_ADAMW);
    oc.lr = 1e-3; oc.weight_decay = wd;
    kn_optim *o = kn_optim_new(ctx, m, &oc);
    static kn_tensor *outs[KN_NN_MAX_OUTS];
    int n = 0;
    outs[n++] = loss;
    int ne = o ? kn_optim_build(o, NULL, outs + 1, KN_NN_MAX_OUTS - 1) : -1;
    if (ne < 0) { kn_optim_free(o); return -1; }
    n += ne;
    kn_plan *p = kn_plan_new(ctx, n, outs, NULL);
    if (!p) { kn_optim_free(o); return -1; }
    double dt = -1;
    for (int i = 0; i < 3 + steps; i++) {
        if (i == 3) dt = kn_bench_now();
        kn_optim_prepare(o);
        if (kn_plan_run(p)) { dt = -1; break; }
    }
    if (dt >= 0) dt = kn_bench_now() - dt;
    kn_plan_free(p);
    kn_optim_free(o);
    return dt;
}

static double bench_mlp(int64_t B, int steps) {
    kn_ctx *ctx = kn_ctx_new(NULL);
    kn_nn_manual_seed(1);
    kn_module *net = kn_sequential_new(ctx, "MLP");
    kn_sequential_add(net, kn_linear_new(ctx, 784, 512, true));
    kn_sequential_add(net, kn_act_new(ctx, KN_ACT_RELU));
    kn_sequential_add(net, kn_linear_new(ctx, 512, 256, true));
    kn_sequential_add(net, kn_act_new(ctx, KN_ACT_RELU));
    kn_sequential_add(net, kn_linear_new(ctx, 256, 10, true));
    kn_tensor *x = kn_input(ctx, KN_F32, 2, (int64_t[]){B, 784}), *y = kn_input(ctx, KN_I64, 1, &B);
    float *xb = malloc(sizeof *xb * (size_t)(B * 784));
    int64_t *yb = malloc(sizeof *yb * (size_t)B);
    for (int64_t i = 0; i < B * 784; i++) xb[i] = (float)((i * 2654435761u) % 1000) / 1000.0f;
    for (int64_t i = 0; i < B; i++) yb[i] = i % 10;
    kn_tensor_write(x, xb, KN_F32);
    kn_tensor_write(y, yb, KN_I64);
    double dt = time_steps(ctx, net, kn_cross_entropy(ctx, kn_module_forward(net, x), y, NULL), 0.0, steps);
    free(xb); free(yb);
    kn_module_free(net);
    kn_ctx_free(ctx);
    return dt > 0 ? (double)(B * steps) / dt : -1;
}

static double bench_gpt(int64_t V, int64_t T, int64_t C, int L, int H, int64_t B, int steps) {
    kn_ctx *ctx = kn_ctx_new(NULL);
    kn_nn_manual_seed(1);
    kn_gpt2_cfg gc = {.vocab = V, .max_seq = T, .dim = C, .n_layers = L, .n_heads = H};
    kn_module *m = kn_gpt2_new(ctx, &gc);
    kn_tensor *ids = kn_input(ctx, KN_I32, 2, (int64_t[]){B, T}), *tg = kn_input(ctx, KN_I64, 2, (int64_t[]){B, T});
    int32_t *ib = malloc(sizeof *ib * (size_t)(B * T));
    int64_t *tb = malloc(sizeof *tb * (size_t)(B * T));
    for (int64_t i = 0; i < B * T; i++) { ib[i] = (int32_t)((i * 7919) % V); tb[i] = (i * 104729) % V; }
    kn_tensor_write(ids, ib, KN_I32);
    kn_tensor_write(tg, tb, KN_I64);
    double dt = time_steps(ctx, m, kn_cross_entropy(ctx, kn_gpt2_forward(m, ids), tg, NULL), 0.01, steps);
    free(ib); free(tb);
    kn_module_free(m);
    kn_ctx_free(ctx);
    return dt > 0 ? (double)(B * T * steps) / dt : -1;
}

int main(int argc, char **argv) {
    int threads = 0, steps = 20, rounds = 3;
    bool compile = false;
    const char *only = NULL;      /* -m mlp|gpt: that model alone, no PyTorch (for profiling) */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-c")) compile = true;
        else if (i + 1 >= argc) break;
        else if (!strcmp(argv[i], "-t")) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-s")) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-r")) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-m")) only = argv[++i];
    }
    if (threads > 0) kn_set_threads(threads);
    threads = kn_threads();
    if (steps < 1) steps = 1;
    const int64_t MB = 128, V = 256, T = 64, C = 128, B = 8;
    const int L = 4, H = 4;
    int gsteps = steps / 2 > 0 ? steps / 2 : 1;

    if (only) {
        double v = !strcmp(only, "mlp") ? bench_mlp(MB, steps) : bench_gpt(V, T, C, L, H, B, steps);
        printf("%s: %.0f %s/s (kiln, %d threads, %d steps)\n", only, v, !strcmp(only, "mlp") ? "samples" : "tok", threads, steps);
        return v > 0 ? 0 : 1;
    }
    enum { MAX_ROUNDS = 15 };
    if (rounds < 1) rounds = 1;
    if (rounds > MAX_ROUNDS) rounds = MAX_ROUNDS;
    double k[2][MAX_ROUNDS], t[2][MAX_ROUNDS];
    char detail[2][MAX_ROUNDS][96];
    char why[256] = "";
    bool have_torch = system("sh -c '. scripts/torch_env.sh && python3 -c \"import torch\"' >/dev/null 2>&1") == 0;
    if (!have_torch) snprintf(why, sizeof why, "python3 -c \"import torch\" fails after . scripts/torch_env.sh (run from the repo root)");
    for (int r = 0; r < rounds; r++) {
        k[0][r] = bench_mlp(MB, steps);
        k[1][r] = bench_gpt(V, T, C, L, H, B, gsteps);
        t[0][r] = t[1][r] = -1;
        detail[0][r][0] = detail[1][r][0] = 0;
        if (!have_torch) continue;
        /* PyTorch, same models/batches/threads, right after kiln */
        char cmd[512];
        snprintf(cmd, sizeof cmd,
                 "sh -c '. scripts/torch_env.sh && python3 scripts/bench_train_torch.py --threads %d --mlp-batch %lld "
                 "--gpt %lld,%lld,%lld,%d,%d,%lld --steps %d%s' 2>&1", threads, (long long)MB, (long long)V, (long long)T,
                 (long long)C, L, H, (long long)B, steps, compile ? " --compile" : "");
        FILE *p = popen(cmd, "r");
        char line[512];
        while (p && fgets(line, sizeof line, p)) {
            double v;
            int n = 0, c = -1;
            if (sscanf(line, "mlp %lf %n", &v, &n) == 1) c = 0;
            else if (sscanf(line, "gpt %lf %n", &v, &n) == 1) c = 1;
            if (c >= 0) {
                t[c][r] = v;
                snprintf(detail[c][r], sizeof detail[c][r], "%s", line + n);
                detail[c][r][strcspn(detail[c][r], "\n")] = 0;
            } else if (!why[0]) snprintf(why, sizeof why, "torch script: %.200s", line);
        }
        if (p && pclose(p) != 0 && !why[0]) snprintf(why, sizeof why, "scripts/bench_train_torch.py failed");
    }

    printf("training throughput, %d threads (%d timed steps mlp, %d gpt; AdamW; one plan per step), "
           "%d rounds kiln / PyTorch alternating, medians\n", threads, steps, gsteps, rounds);
    printf("%-44s %14s %14s %8s\n", "case", "kiln", "pytorch", "ratio");
    const char *names[2] = {"mlp 784-512-256-10 B=128 (samples/s)", "gpt V=256 T=64 C=128 L=4 H=4 B=8 (tok/s)"};
    double km[2], tm[2];
    for (int i = 0; i < 2; i++) {
        double ks_[MAX_ROUNDS], ts_[MAX_ROUNDS];
        memcpy(ks_, k[i], sizeof(double) * (size_t)rounds);
        memcpy(ts_, t[i], sizeof(double) * (size_t)rounds);
        qsort(ks_, (size_t)rounds, sizeof(double), kn_bench_cmp_double);
        qsort(ts_, (size_t)rounds, sizeof(double), kn_bench_cmp_double);
        km[i] = ks_[rounds / 2];
        tm[i] = ts_[rounds / 2];
        char ks[32], ts[32], rs[32];
        snprintf(ks, sizeof ks, km[i] > 0 ? "%.0f" : "error", km[i]);
        snprintf(ts, sizeof ts, tm[i] > 0 ? "%.0f" : "n/a", tm[i]);
        snprintf(rs, sizeof rs, km[i] > 0 && tm[i] > 0 ? "%.2fx" : "n/a", km[i] / tm[i]);
        printf("%-44s %14s %14s %8s\n", names[i], ks, ts, rs);
    }
    for (int i = 0; i < 2; i++)
        for (int r = 0; r < rounds; r++)
            printf("  %s round %d: kiln %.0f, pytorch %.0f (%s)\n", i ? "gpt" : "mlp", r + 1, k[i][r], t[i][r],
                   detail[i][r][0] ? detail[i][r] : "n/a");
    if (tm[0] <= 0 || tm[1] <= 0) printf("pytorch n/a: %s\n", why[0] ? why : "no result");
    printf("ratio = kiln / pytorch (higher is better for kiln)\n");
    if (km[0] <= 0 || km[1] <= 0) { fprintf(stderr, "bench_train: %s\n", kn_last_error()); return 1; }
    return 0;
}
