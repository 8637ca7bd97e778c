/*
 * sched_plan_cli: `pivirt-scheduler plan`, one plan from JSON on stdin to JSON on stdout.
 *
 *   in:  {"strategy":"AUTO","need":3,"limit":0,"total":10,
 *         "nodes":[{"name":"n1","capacity":10,"count":2,"usage":0.5,"rate":0.1}]}
 *   out: {"plan":{"n1":1}}                                              exit 0
 *        {"error":{"kind":"ErrInsufficientResource","message":"..."}}   exit 1
 *        a message on stderr for input that is not such an object       exit 2
 *
 * `limit` (default 0), `total` (default: the sum of the capacities), and per node `count`, `usage`
 * and `rate` (default 0) are optional. Plan entries follow the order of `nodes`.
 *
 * Ownership: nothing outlives a call; every path frees what it parsed.
 */
#ifndef SCHED_PLAN_CLI_H
#define SCHED_PLAN_CLI_H

#include <stddef.h>
#include <stdio.h>

/* Exit statuses. */
enum { SCHED_CLI_OK = 0, SCHED_CLI_PLAN_ERROR = 1, SCHED_CLI_BAD_INPUT = 2 };

/*
 * Evaluates one request held in memory. On SCHED_CLI_OK and SCHED_CLI_PLAN_ERROR *out is the
 * answer (one line of compact JSON, no newline; the caller frees it with free()); on
 * SCHED_CLI_BAD_INPUT *out is NULL and msg holds the reason.
 */
int sched_plan_cli_eval(const char *input, size_t len, char **out, char *msg, size_t msg_size);

/* `pivirt-scheduler plan [--help]`: argv[0] is "plan". Reads stdin, writes stdout/stderr. */
int sched_plan_cli_main(int argc, char **argv);

#endif
