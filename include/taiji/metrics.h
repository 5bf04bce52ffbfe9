/* taiji monitoring: runtime metrics, step marks, the flight recorder. Included by <taiji/taiji.h>. */
#ifndef TAIJI_METRICS_H
#define TAIJI_METRICS_H

#include "taiji/taiji.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif

#endif /* TAIJI_METRICS_H */
