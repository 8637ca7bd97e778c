/*
 * pv_time: points in time as clients write them (LogStream's since and until, as Docker's logs
 * and therefore Eru take them): an RFC 3339 time ("2026-12-02T16:55:38Z", a fraction and a
 * numeric offset allowed), Unix seconds ("1796229307", a fraction allowed), or a duration back
 * from now ("10m", "1h30m", "45s", "500ms", Go's units h, m, s, ms).
 */
#ifndef PV_TIME_H
#define PV_TIME_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include "pv_status.h"

/* The longest TTL a client may give a status key (SetNodeStatus, SetWorkloadsStatus): ten
 * years. Redis refuses expiries past about 2^63 ms from now with its own words; a TTL of decades
 * is a client's mistake, refused naming the field instead. */
#define PV_TTL_MAX_SECONDS (10LL * 366 * 24 * 3600)

/* *out_ms: the time text means, in wall-clock milliseconds since the epoch; now_ms anchors
 * durations. INVALID_ARGUMENT naming field and text when it is none of the three forms. */
int pv_time_parse(const char *field, const char *text, int64_t now_ms, int64_t *out_ms,
                  pv_status *st);

/* Wall-clock milliseconds since the epoch: what records and operators see. */
int64_t pv_time_now_ms(void);

/* Monotonic milliseconds (CLOCK_MONOTONIC): for timeouts and durations, which a clock step must
 * not stretch or cut. */
int64_t pv_time_mono_ms(void);

/* The CLOCK_MONOTONIC time ms milliseconds from now, as the deadline of a timed wait on a cv
 * from pv_time_cond_init (pthread_cond_timedwait). */
struct timespec pv_time_mono_after(int64_t ms);

/* Initialises cv to time its waits on CLOCK_MONOTONIC (pthread_cond_timedwait then takes a
 * monotonic deadline, which a step of the wall clock cannot move). 0, or pthread's error. */
int pv_time_cond_init(pthread_cond_t *cv);

#endif
