/* sched.c: learning-rate schedules as host functions of the 0-based step;
 * the result goes to kn_optim_set_lr before kn_optim_prepare. */
#include "kiln_nn.h"
#include <math.h>

double kn_sched_constant(int64_t step, double lr) { (void)step; return lr; }

double kn_sched_step(int64_t step, double lr, int64_t step_size, double gamma) {
    if (step_size <= 0 || step < 0) return lr;
    return lr * pow(gamma, (double)(step / step_size));
}

static double warm(int64_t step, double lr, int64_t warmup) { return lr * (double)(step + 1) / (double)warmup; }

double kn_sched_linear(int64_t step, double lr, double min_lr, int64_t warmup, int64_t total) {
    if (step < warmup) return warm(step, lr, warmup);
    if (step >= total || total <= warmup) return min_lr;
    double r = (double)(step - warmup) / (double)(total - warmup);
    return lr + (min_lr - lr) * r;
}

double kn_sched_cosine(int64_t step, double lr, double min_lr, int64_t warmup, int64_t total) {
    if (step < warmup) return warm(step, lr, warmup);
    if (step >= total || total <= warmup) return min_lr;
    double r = (double)(step - warmup) / (double)(total - warmup);
    return min_lr + 0.5 * (1.0 + cos(M_PI * r)) * (lr - min_lr);
}

/* torch.optim.lr_scheduler.OneCycleLR with anneal_strategy='cos', two phases:
 * phase 1 ends at step pct_start*total - 1, phase 2 at total - 1. */
double kn_sched_one_cycle(int64_t step, double max_lr, int64_t total, double pct_start, double div_factor, double final_div_factor) {
    double initial = max_lr / div_factor, final = initial / final_div_factor;
    double end1 = pct_start * (double)total - 1, end2 = (double)total - 1;
    double s = (double)step;
    if (s <= end1) {
        double pct = end1 > 0 ? s / end1 : 1;
        return max_lr + (initial - max_lr) * 0.5 * (1 + cos(M_PI * pct));
    }
    double pct = end2 > end1 ? (s - end1) / (end2 - end1) : 1;
    if (pct > 1) pct = 1;
    return final + (max_lr - final) * 0.5 * (1 + cos(M_PI * pct));
}
