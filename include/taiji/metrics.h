/* taiji monitoring: runtime metrics, step marks, round-trip probes, the flight recorder.
 * Included by <taiji/taiji.h>.
 *
 * Every peer keeps, from taiji_peer_init on (unless TAIJI_METRICS=0):
 *  - per op kind and per op name (the first 1024 names; later ones are counted together
 *    as "taiji.other", a reserved name no op can have): ops ended, errors, bytes (count times element size) and the latency
 *    from posting to completion (p50, p90, p99 from a log-scale histogram);
 *  - per link: bytes sent and received, smoothed throughput, round-trip times measured
 *    by taiji_metrics_probe_rtt;
 *  - per step (taiji_step_mark): every rank's step time, the median, straggler flags;
 *  - the flight recorder: the last TAIJI_FLIGHT_RECORDER_SIZE ops (default 256) with
 *    name, version, kind, size, strategy, timings and state, dumped to a file in
 *    TAIJI_FLIGHT_RECORDER_DIR (logged at warning level) whenever ops time out.
 * With TAIJI_METRICS_ADDR=[host:]port every peer also serves them in the Prometheus text
 * format at http://host:port/metrics (host default 127.0.0.1; peers on one host take
 * port, port+1, ... in rank order; port 0 takes a free one, see taiji_metrics_address).
 *
 * Text outputs follow one rule: *needed (when needed is not NULL) is set to the bytes the
 * text takes with its NUL. If len is at least that, the text is written NUL-terminated
 * and TAIJI_OK returned; otherwise buf is left alone and TAIJI_ERR_INVALID_ARGUMENT is
 * returned, so buf NULL and len 0 asks for the size. A snapshot can grow between two
 * calls: allow some slack, or call again while *needed > len.
 *
 * The JSON snapshot (taiji_metrics_json), schema_version 1; fields are only added:
 *  { "schema_version": 1, "rank": R, "size": N, "enabled": true|false,
 *    "uptime_seconds": s,
 *    "ops": { "<kind>": { "count", "errors", "bytes",
 *             "latency_seconds": { "sum", "max", "p50", "p90", "p99" } }, ... },
 *        (kinds: allreduce broadcast barrier allgather reduce gather reduce_scatter
 *        consensus; every kind is present)
 *    "names": [ { "name", "kind", "count", "errors", "bytes", "latency_seconds" }, ... ],
 *        (sorted by name, then "taiji.other" if any), "names_cap": 1024,
 *    "links": [ { "peer", "bytes_sent", "bytes_received", "send_bytes_per_second",
 *                 "receive_bytes_per_second", "rtt_seconds", "rtt_min_seconds",
 *                 "rtt_probes", "shm_bytes_sent", "read_pauses" }, ... ],
 *        (every other rank; rtt_* null before a probe; shm_bytes_sent: the part of
 *        bytes_sent that went through shared memory; read_pauses: times reads from that
 *        peer paused because the early-arrival buffer was full)
 *    "early_arrival_bytes_max": B,  (most bytes ever held at once for ops not posted yet;
 *        TAIJI_UNEXPECTED_BYTES caps it, give or take the frame that crossed the cap)
 *    "steps": { "count", "median_seconds", "straggler_ratio",
 *               "ranks": [ { "rank", "seconds", "straggler", "straggler_steps" } ] },
 *    "gauges": [ { "name", "labels": { ... }, "value" } ],  (set by other components)
 *    "flight_recorder": { "capacity", "dumps" } }
 *
 * The flight recorder (taiji_flight_recorder_json and the dump files), schema_version 1:
 *  { "schema_version": 1, "rank": R, "capacity": C, "reason": "...",
 *    "ops": [ { "seq", "name", "version", "kind", "bytes", "strategy",
 *               "state": "running"|"ok"|"failing"|"failed", "status" (e.g. "timeout"),
 *               "error", "start_unix_us", "queued_seconds", "run_seconds" }, ... ] }
 * oldest first; "failing" is an op that failed and still waits for its buffers. */
#ifndef TAIJI_METRICS_H
#define TAIJI_METRICS_H

#include "taiji/taiji.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TAIJI_METRICS_SCHEMA_VERSION 1

/* The metrics snapshot as JSON (schema above). Never blocks on the network: it copies the
 * counters under a short lock. Any thread. Errors: ERR_INVALID_ARGUMENT (NULL peer, buffer
 * too small), ERR_NO_MEMORY. Works after taiji_peer_finalize too (the last values). */
TAIJI_API taiji_status_t taiji_metrics_json(taiji_peer_t *peer, char *buf, size_t len,
                                            size_t *needed);

/* The flight recorder as JSON (schema above; "reason" is "requested"). Like
 * taiji_metrics_json: never blocks on the network, any thread, same errors. */
TAIJI_API taiji_status_t taiji_flight_recorder_json(taiji_peer_t *peer, char *buf, size_t len,
                                                    size_t *needed);

/* Turns op counting and recording on (enabled != 0) or off, from the next op that starts.
 * Link byte counters and step marks go on regardless. Never blocks; any thread. Errors:
 * ERR_INVALID_ARGUMENT (NULL peer). */
TAIJI_API taiji_status_t taiji_metrics_set_enabled(taiji_peer_t *peer, int enabled);

/* The "host:port" the Prometheus endpoint is bound to ("" when TAIJI_METRICS_ADDR is
 * unset), under the text output rule above. Never blocks; any thread. */
TAIJI_API taiji_status_t taiji_metrics_address(taiji_peer_t *peer, char *buf, size_t len,
                                               size_t *needed);

/* Sends a round-trip probe to every other rank and waits up to timeout_ms (> 0) for all
 * replies; each link's round-trip time is then in the snapshot. A probe travels on the
 * same connection as the data, so it includes the wait behind queued data. Blocks; any
 * thread but a completion callback. A newer probe (from another thread) ends an older
 * one with ERR_ABORTED. Errors: ERR_INVALID_ARGUMENT, ERR_TIMEOUT (the message names the
 * ranks that did not answer), ERR_FINALIZED. */
TAIJI_API taiji_status_t taiji_metrics_probe_rtt(taiji_peer_t *peer, int64_t timeout_ms);

/* Marks the end of a training step on this rank. A collective: every rank calls it once
 * per step, in the same order relative to its other ops (it is an allgather of one value
 * under the reserved name "taiji.step"). The step time of a rank is the time since its
 * previous mark returned (blocking) or was posted (asynchronous); the first mark only
 * starts the clock. When the mark completes, every peer's snapshot holds every rank's
 * step time, the median, and which ranks took over 1.5 times the median (and 1 ms more):
 * the stragglers. Steps in which ranks block in collectives waiting for a slow rank look
 * alike everywhere; place the mark where the rank's own work ends (before the collective
 * that waits for the others) to see who is slow. Blocking or asynchronous like every op
 * (options: timeout_ms and callback; version, topology and grad_stats are ignored).
 * Errors: as for the collectives in taiji.h. */
TAIJI_API taiji_status_t taiji_step_mark(taiji_peer_t *peer, const taiji_op_options_t *options,
                                         taiji_request_t **request);

#ifdef __cplusplus
}
#endif

#endif /* TAIJI_METRICS_H */
