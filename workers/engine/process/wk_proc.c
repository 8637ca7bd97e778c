/*
 * wk_proc: a process's run state from /proc (see wk_proc.h for why "stopped" is more than T).
 */
#include "wk_proc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char wk_proc_state(pid_t pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* the command name may hold spaces and parentheses: the state follows the last ')' */
    const char *close = strrchr(buf, ')');
    return close && close[1] == ' ' ? close[2] : 0;
}

static bool is_stopped_letter(char s) {
    return s == 'T' || s == 't';
}

/* Whether one of pid's children (its main thread's, which is where a vfork happens) is in T. */
static bool has_stopped_child(pid_t pid) {
    char path[80];
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)pid, (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    bool stopped = false;
    int child;
    while (!stopped && fscanf(f, "%d", &child) == 1)
        stopped = is_stopped_letter(wk_proc_state((pid_t)child));
    fclose(f);
    return stopped;
}

bool wk_proc_stopped(pid_t pid) {
    char s = wk_proc_state(pid);
    if (s == 0 || is_stopped_letter(s)) return true;
    return s == 'D' && has_stopped_child(pid);
}
