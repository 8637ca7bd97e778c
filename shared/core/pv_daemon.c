/*
 * pv_daemon: common start-up and signal handling of the daemons (see pv_daemon.h).
 */
#include "pv_daemon.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdbool.h>
#include <string.h>

#include "pv_log.h"
#include "pv_version.h"

static void block_signals(sigset_t *sigs) {
    sigemptyset(sigs);
    sigaddset(sigs, SIGINT);
    sigaddset(sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
}

int pv_daemon_init(const char *program, const char *usage, pv_config *cfg, int *argc, char **argv) {
    pv_status st;
    const char *component = strncmp(program, "pivirt-", 7) == 0 ? program + 7 : program;
    pv_log_init(component, PV_LOG_INFO);
    if (pv_config_load(cfg, argc, argv, &st) != PV_OK) {
        fprintf(stderr, "%s: %s\n", program, st.msg);
        return 2;
    }
    for (int i = 1; i < *argc; i++) {
        if (strcmp(argv[i], "--version") == 0) {
            printf("%s %s (%s)\n", program, PV_VERSION, PV_GIT_REVISION);
            return 0;
        }
        if (strcmp(argv[i], "--print-config") == 0) {
            /* The effective configuration, passwords shown as "***". */
            char *json = pv_config_dump_json(cfg);
            if (!json) return 1;
            printf("%s\n", json);
            free(json);
            return 0;
        }
        bool help = strcmp(argv[i], "--help") == 0;
        if (!help) fprintf(stderr, "%s: unknown argument \"%s\"\n", program, argv[i]);
        fputs(usage, help ? stdout : stderr);
        return help ? 0 : 2;
    }
    pv_log_set_level(cfg->log_level);
    sigset_t sigs;
    block_signals(&sigs);
    return -1;
}

int pv_daemon_wait_signal(void) {
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    int sig = 0;
    sigwait(&sigs, &sig);
    return sig;
}
