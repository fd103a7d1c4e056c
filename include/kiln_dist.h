/* kiln_dist.h: several processes working as one: a communicator (kn_dist)
 * over one process per GPU (or per CPU rank), collectives on host buffers and
 * as graph ops on a backend's tensors, and data-parallel training.
 *
 *   // every rank, started by `kiln run --nproc N ...` (or torchrun/mpirun-style
 *   // launchers that set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)
 *   kn_dist *d;
 *   if (kn_dist_init_env(&d)) { fprintf(stderr, "%s\n", kn_last_error()); return 1; }
 *   kn_tensor *y = kn_all_reduce(ctx, x, d, KN_DIST_SUM);   // a graph op
 *   kn_optim_set_dist(opt, d, 0);      // before kn_optim_build: gradients averaged over ranks
 *   ...
 *   kn_dist_free(d);
 *
 * Transport. Ranks meet at MASTER_ADDR:MASTER_PORT over TCP: rank 0 listens,
 * the others connect (retrying until the timeout) and say who they are; that
 * connection stays open as the control channel (rank 0 in the middle). Host
 * collectives go over it (gathered at rank 0, reduced there in rank order,
 * sent back: deterministic, meant for CPU ranks, checks and small data).
 * On the CUDA backend the graph ops run through NCCL (libnccl.so.2, loaded
 * when the first collective runs: the CUDA toolkit's or the nvidia-nccl wheel's,
 * or the file KN_NCCL_LIB names), whose unique id travels over the control
 * channel. Each rank's CUDA backend uses GPU LOCAL_RANK (KN_CUDA_DEVICE wins).
 *
 * Failure. Every wait has a deadline (KN_DIST_TIMEOUT seconds, default 600;
 * kn_dist_init's argument): a rank that died (its socket closes), a rank that
 * stopped calling, a collective called with another size or kind on another
 * rank (each message carries its kind and size) are reported as errors naming
 * the ranks, never a silent hang; `kiln run` stops the other ranks when one
 * exits with an error.
 *
 * A world of one (no RANK/WORLD_SIZE in the environment) needs no sockets:
 * collectives copy, and a training step gives the same bits as without the
 * communicator.
 */
#ifndef KILN_DIST_H
#define KILN_DIST_H
#pragma GCC visibility push(default)
#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { KN_DIST_SUM, KN_DIST_AVG, KN_DIST_MAX, KN_DIST_MIN } kn_dist_op;

/* From the environment: RANK (0), WORLD_SIZE (1), LOCAL_RANK (RANK),
 * MASTER_ADDR (127.0.0.1), MASTER_PORT (29500), KN_DIST_TIMEOUT (600 s).
 * Blocks until every rank has joined (or the timeout). */
kn_status kn_dist_init_env(kn_dist **out);
/* The same with explicit values (addr: numeric IPv4 or a host name). */
kn_status kn_dist_init(int rank, int world, int local_rank, const char *addr, int port, double timeout_s,
                       kn_dist **out);
/* Closes the connections (after the device communicator, if any). NULL: nothing. */
void kn_dist_free(kn_dist *d);
int kn_dist_rank(const kn_dist *d);         /* 0 for NULL */
int kn_dist_world(const kn_dist *d);        /* 1 for NULL */
int kn_dist_local_rank(const kn_dist *d);   /* 0 for NULL */

/* ---- host collectives (over the control channel; every rank must call them
 * in the same order with the same sizes) ---- */
kn_status kn_dist_barrier(kn_dist *d);
/* root's n bytes into every rank's buf */
kn_status kn_dist_broadcast_host(kn_dist *d, void *buf, size_t n, int root);
/* n elements of dt (f32, f64, f16, bf16, i32, i64) reduced in place on every
 * rank; sums are taken in double in rank order, so every rank gets the same bits. */
kn_status kn_dist_all_reduce_host(kn_dist *d, kn_dtype dt, void *buf, int64_t n, kn_dist_op op);
/* Rank r's n bytes at out + r * n on every rank (out: world * n bytes). */
kn_status kn_dist_all_gather_host(kn_dist *d, const void *in, size_t n, void *out);
/* Every rank says what it has (what = "model", value = "gpt2 12x768 vocab 50257");
 * a rank whose value differs from rank 0's makes every rank fail with a message
 * naming that rank and both values. */
kn_status kn_dist_check_same(kn_dist *d, const char *what, const char *value);

/* ---- collectives as graph ops: on tensors of the context's backend ----
 * all_reduce: y[i] = op over ranks of x[i] (x's shape and dtype on every rank).
 * all_gather: x [n, ...] on each rank -> y [world * n, ...], rank r's rows at r * n.
 * reduce_scatter: x [world * n, ...] -> y [n, ...], rank r gets rows r*n.. summed (op).
 * broadcast: y = root's x on every rank.
 * No gradients flow through them (build them under kn_no_grad or on detached values). */
kn_tensor *kn_all_reduce(kn_ctx *ctx, kn_tensor *x, kn_dist *d, kn_dist_op op);
kn_tensor *kn_all_gather(kn_ctx *ctx, kn_tensor *x, kn_dist *d);
kn_tensor *kn_reduce_scatter(kn_ctx *ctx, kn_tensor *x, kn_dist *d, kn_dist_op op);
kn_tensor *kn_broadcast(kn_ctx *ctx, kn_tensor *x, kn_dist *d, int root);

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif
