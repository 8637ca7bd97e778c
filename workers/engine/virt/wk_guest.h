/*
 * wk_guest: commands in a running guest through its QEMU guest agent (qemu-ga on the
 * org.qemu.guest_agent.0 virtio-serial channel every domain of the virt engine has), sent with
 * libvirt's virDomainQemuAgentCommand (libvirt-qemu):
 *
 *   exec   guest-exec {path, arg, input-data, capture-output}, then guest-exec-status polled
 *          until the command has exited (the agent gives its output only then, and drops the
 *          status once it has reported it: the first answer with exited is kept);
 *   files  guest-file-open / -write / -read / -close in chunks: reads of WK_GUEST_CHUNK bytes,
 *          well under the 4 MiB libvirt lets a reply carry (base64 makes a chunk 4/3 as large);
 *          writes of WK_GUEST_WRITE_CHUNK: a command of 256 KiB or more to qemu-ga 7.2 is never
 *          answered (the agent then stays out of step with libvirt: "Guest agent not available
 *          for now" for every later command), 192 KiB still is.
 *
 * A guest whose agent is not connected (libvirt: "QEMU guest agent is not connected") is waited
 * for until the deadline the caller gives (an agent connects 2-3 s after a boot), then the call
 * fails UNAVAILABLE naming the workload: it never waits without bound.
 *
 * The handle holds a libvirt connection of its own, used under its own mutex one agent command
 * at a time: a guest that is slow to answer holds up the other guests' commands for at most one
 * command's timeout, never the engine's lifecycle calls (which use the engine's connection).
 * Polls sleep without the mutex. Any thread may call.
 * Ownership: output buffers are malloc'd for the caller.
 */
#ifndef WK_GUEST_H
#define WK_GUEST_H

#include <stddef.h>
#include <stdint.h>

#include "pv_status.h"

#define WK_GUEST_CHUNK (1024 * 1024) /* a read; a write carries at most WK_GUEST_WRITE_CHUNK */
#define WK_GUEST_WRITE_CHUNK (96 * 1024)
#define WK_GUEST_OUTPUT_MAX (1024 * 1024) /* exec output kept, as the process engine's */
/* The most standard input an exec takes: guest-exec carries it whole, base64, in its
 * input-data (4/3 as large), and a command of 256 KiB or more is never answered; this leaves
 * the command's arguments 64 KiB of a 192 KiB command. */
#define WK_GUEST_INPUT_MAX (96 * 1024)

typedef struct wk_guest wk_guest;

int wk_guest_open(const char *uri, wk_guest **out, pv_status *st);
void wk_guest_close(wk_guest *g);

/* The guest of workload id, domain uuid: agent_deadline_ms (monotonic, pv_time_mono_ms) is how
 * long a guest agent that is not connected is waited for. */
typedef struct wk_guest_target {
    const char *id, *uuid;
    int64_t agent_deadline_ms;
} wk_guest_target;

/* Runs argv in the guest with input (may be NULL) on its standard input, waiting at most
 * timeout_ms (<= 0: no limit) for it to exit. *exit_code: its status, 128+N for a signal, 127
 * with the agent's message as output when the program could not be started. Output: stdout
 * then stderr, at most WK_GUEST_OUTPUT_MAX bytes. Past the timeout the command is killed in the
 * guest (kill -9) and the call answers DEADLINE_EXCEEDED with *exit_code 137. */
int wk_guest_exec(wk_guest *g, const wk_guest_target *t, const char *const *argv, size_t argc,
                  const void *input, size_t input_len, int timeout_ms, int *exit_code,
                  char **output, size_t *output_len, pv_status *st);

/* Writes data to path in the guest (created or truncated; its directory made first). */
int wk_guest_write_file(wk_guest *g, const wk_guest_target *t, const char *path, const void *data,
                        size_t len, pv_status *st);

/* Reads the file at path in the guest, at most max bytes (FAILED_PRECONDITION beyond). */
int wk_guest_read_file(wk_guest *g, const wk_guest_target *t, const char *path, size_t max,
                       char **data, size_t *len, pv_status *st);

#endif
