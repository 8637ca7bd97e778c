/*
 * wk_proc: what /proc says of a process's run state, for the process engine's pause and for
 * the tests that check it.
 *
 * A SIGSTOP sent to a workload's process group does not leave every member in state T: a shell
 * that runs a command with vfork (dash does, for simple commands) waits for its child in state D
 * until the child has exec'd, and a child stopped before its exec keeps the parent there until
 * SIGCONT. Such a parent runs nothing either, so it counts as stopped.
 *
 * No state of its own; callable from any thread.
 */
#ifndef WK_PROC_H
#define WK_PROC_H

#include <stdbool.h>
#include <sys/types.h>

/* The state letter of /proc/<pid>/stat (R, S, D, T, t, Z, ...), or 0 when there is no such
 * process. */
char wk_proc_state(pid_t pid);

/* Whether pid has taken a SIGSTOP: state T (or t), or D with a child of its own in T (a vfork
 * parent whose child was stopped before it could exec). A process that is gone is stopped. */
bool wk_proc_stopped(pid_t pid);

#endif
