/*
 * pv_daemon: the start and end every pivirt daemon shares (worker, scheduler; the gateway has
 * its own because its server owns threads of its own).
 *
 * pv_daemon_init loads the configuration (file, environment, --set), handles --version and
 * --help, sets up logging and blocks SIGINT/SIGTERM in every thread created afterwards, so that
 * only pv_daemon_wait_signal receives them.
 */
#ifndef PV_DAEMON_H
#define PV_DAEMON_H

#include "pv_config.h"

/* Returns -1 to continue, or the exit status the program should return now (0 after --version,
 * --help or --print-config, which prints the effective configuration with passwords masked, 2 after
 * a configuration error, printed to stderr). cfg is initialised in every case and freed by the
 * caller with pv_config_free. */
int pv_daemon_init(const char *program, const char *usage, pv_config *cfg, int *argc, char **argv);

/* Blocks until SIGINT or SIGTERM; returns the signal. */
int pv_daemon_wait_signal(void);

#endif
