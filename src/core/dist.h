/* core/dist.h: the communicator's internals that backends need (kiln_dist.h
 * is the public side): the device communicator slot a backend fills on first
 * use (the CUDA backend keeps its NCCL communicator and streams there), and
 * the control channel's broadcast, through which such a backend shares its
 * bootstrap id. */
#ifndef KN_CORE_DIST_H
#define KN_CORE_DIST_H
#include "kiln_dist.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The backend's state for this communicator (NULL until set) and the
 * function that frees it (called first by kn_dist_free). */
void *kn__dist_dev(const kn_dist *d);
void kn__dist_set_dev(kn_dist *d, void *dev, void (*dev_free)(void *dev));
double kn__dist_timeout(const kn_dist *d);
/* The name of a reduce op ("sum") for messages. */
const char *kn__dist_op_name(int op);

#ifdef __cplusplus
}
#endif
#endif
