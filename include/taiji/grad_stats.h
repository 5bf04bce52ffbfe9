/* taiji gradient statistics computed inside the allreduce. Included by <taiji/taiji.h>. */
#ifndef TAIJI_GRAD_STATS_H
#define TAIJI_GRAD_STATS_H

#include "taiji/taiji.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif

#endif /* TAIJI_GRAD_STATS_H */
