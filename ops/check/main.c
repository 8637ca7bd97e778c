/*
 * pivirt-check: audits the whole state of a pivirt system (see ck_audit.h) and reports every
 * difference, one line each, then a summary line.
 *
 *   pivirt-check [--config FILE] [--set key=value]... [-o text|json] [--grace-ms N]
 *                [--confirm-ms N]
 *
 * The audit reads while the system runs, so a change in flight can look like a difference for a
 * moment: unless --confirm-ms 0, a pass that finds differences is followed, confirm-ms later
 * (1000), by a second one, and only what both see is reported. Exit status: 0 when clean, 1 when
 * there are differences, 2 when the audit could not run (bad arguments, Redis away).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "ck_audit.h"
#include "ck_report.h"
#include "pv_time.h"
#include "pv_config.h"
#include "pv_log.h"

static void usage(FILE *f) {
    fprintf(f, "usage: pivirt-check [--config FILE] [--set key=value]... [-o text|json]\n"
               "                    [--grace-ms N] [--confirm-ms N]\n"
               "Audits records vs streams vs reservations vs engines vs volumes; one line per\n"
               "difference. Exit 0 clean, 1 differences, 2 error.\n");
}

static int parse_ms(const char *s, long long *out) {
    char *end = NULL;
    long long v = s ? strtoll(s, &end, 10) : -1;
    if (!s || !*s || *end || v < 0) return -1;
    *out = v;
    return 0;
}

int main(int argc, char **argv) {
    pv_config cfg;
    pv_status st = {0};
    if (pv_config_load(&cfg, &argc, argv, &st) != PV_OK) {
        fprintf(stderr, "pivirt-check: %s\n", st.msg);
        return 2;
    }
    /* the report goes to stdout; the library's own log lines only when they matter */
    pv_log_set_level(PV_LOG_WARN);
    int json = 0;
    long long grace = 60000, confirm = 1000;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "-o") == 0 && v && (strcmp(v, "json") == 0 || strcmp(v, "text") == 0)) {
            json = strcmp(v, "json") == 0;
            i++;
        } else if (strcmp(a, "--grace-ms") == 0 && parse_ms(v, &grace) == 0) {
            i++;
        } else if (strcmp(a, "--confirm-ms") == 0 && parse_ms(v, &confirm) == 0) {
            i++;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            pv_config_free(&cfg);
            return 0;
        } else {
            fprintf(stderr, "pivirt-check: bad argument %s\n", a);
            usage(stderr);
            pv_config_free(&cfg);
            return 2;
        }
    }
    pv_keys keys;
    pv_redis_opts ro;
    pv_redis *r = NULL;
    pv_redis_opts_from_config(&cfg, &ro);
    int rc = pv_keys_init(&keys, cfg.redis.prefix, &st);
    ck_opts o = {.cfg = &cfg, .grace_ms = grace};
    ck_report rep = {0};
    int64_t t0 = pv_time_mono_ms();
    /* The audit only reads: the function library the running daemons loaded serves its FCALLs,
     * and replacing it with this build's could change what they run. Only a Redis that has
     * none (no daemon ever connected) gets this build's. */
    ro.load_functions = 0;
    if (rc == PV_OK) rc = pv_redis_new(&ro, &r, &st);
    if (rc == PV_OK) rc = ck_audit_run(r, &keys, &o, &rep, &st);
    if (rc != PV_OK && r && strstr(st.msg, "unction not found")) {
        pv_redis_free(r);
        r = NULL;
        ck_report_free(&rep);
        ro.load_functions = 1;
        rc = pv_redis_new(&ro, &r, &st);
        if (rc == PV_OK) rc = ck_audit_run(r, &keys, &o, &rep, &st);
    }
    if (rc == PV_OK && rep.ndiffs > 0 && confirm > 0) {
        struct timespec ts = {confirm / 1000, (confirm % 1000) * 1000000};
        nanosleep(&ts, NULL);
        ck_report again = {0};
        rc = ck_audit_run(r, &keys, &o, &again, &st);
        /* report the second pass (its figures are the latest) minus what the first did not see */
        if (rc == PV_OK) ck_report_keep_seen(&again, &rep);
        ck_report_free(&rep);
        rep = again;
    }
    int64_t elapsed = pv_time_mono_ms() - t0;
    int code;
    if (rc != PV_OK) {
        fprintf(stderr, "pivirt-check: %s\n", st.msg);
        code = 2;
    } else {
        ck_report_sort(&rep);
        if (json)
            ck_report_print_json(&rep, stdout, elapsed);
        else
            ck_report_print_text(&rep, stdout, elapsed);
        code = rep.ndiffs > 0 ? 1 : 0;
    }
    ck_report_free(&rep);
    pv_redis_free(r);
    pv_config_free(&cfg);
    return code;
}
