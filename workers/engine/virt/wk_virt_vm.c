/*
 * wk_virt_vm: a VM's files and devices (see wk_virt_vm.h).
 */
#include "wk_virt_vm.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "wk_files.h"
#include "wk_log_index.h"
#include "wk_xml.h"

#define QEMU_IMG_OUTPUT_MAX 2048

extern char **environ;

void wk_virt_vm_clear(wk_virt_vm *vm) {
    if (!vm) return;
    wk_vm_image_clear(&vm->image);
    memset(vm, 0, sizeof *vm);
}

void wk_virt_vm_log_path(const char *state_dir, const char *id, char *out, size_t cap) {
    snprintf(out, cap, "%s/logs/%s.log", state_dir, id);
}

void wk_virt_vm_index_path(const char *log_path, char *out, size_t cap) {
    size_t n = strlen(log_path);
    if (n > 4 && strcmp(log_path + n - 4, ".log") == 0) n -= 4;
    snprintf(out, cap, "%.*s.idx", (int)n, log_path);
}

/* <state_dir>/<sub>, made searchable (not listable) by QEMU's user, who reaches the disks and
 * kernels inside by name. */
static int state_subdir(const char *state_dir, const char *sub, char *out, size_t cap,
                        pv_status *st) {
    if ((size_t)snprintf(out, cap, "%s/%s", state_dir, sub) >= cap)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "state_dir %s: too long", state_dir);
    if (wk_files_mkdir_p(out, 0711) != 0 || chmod(out, 0711) != 0)
        return pv_status_set(st, PV_INTERNAL, "mkdir %s: %s", out, strerror(errno));
    return PV_OK;
}

/* Runs argv (argv[0] looked up in PATH) and waits for it; its output in msg when it fails. */
static int run_tool(const char *const *argv, char *msg, size_t cap) {
    int p[2];
    msg[0] = '\0';
    if (pipe2(p, O_CLOEXEC) != 0) return snprintf(msg, cap, "pipe: %s", strerror(errno)), -1;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, p[1], 1);
    posix_spawn_file_actions_adddup2(&fa, p[1], 2);
    pid_t pid;
    int err = posix_spawnp(&pid, argv[0], &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(p[1]);
    size_t len = 0;
    for (ssize_t n; err == 0 && (n = read(p[0], msg + len, cap - 1 - len)) != 0;)
        if (n > 0)
            len += (size_t)n;
        else if (errno != EINTR)
            break;
    msg[len] = '\0';
    close(p[0]);
    if (err != 0) return snprintf(msg, cap, "%s: %s", argv[0], strerror(err)), -1;
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

static int make_overlay(const wk_virt_dirs *d, const char *id, const char *image, wk_virt_vm *vm,
                        pv_status *st) {
    char disks[PATH_MAX];
    int rc = state_subdir(d->state_dir, "disks", disks, sizeof disks, st);
    if (rc != PV_OK) return rc;
    unsigned int nonce = 0;
    if (getrandom(&nonce, sizeof nonce, 0) != (ssize_t)sizeof nonce)
        nonce = (unsigned int)getpid() ^ (unsigned int)time(NULL);
    if ((size_t)snprintf(vm->overlay, sizeof vm->overlay, "%.*s/%s-%08x.qcow2", PATH_MAX - 100,
                         disks, id, nonce) >= sizeof vm->overlay)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "state_dir %s: too long", d->state_dir);
    const char *tool = d->qemu_img && *d->qemu_img ? d->qemu_img : "qemu-img";
    const char *argv[] = {
        tool, "create",       "-q",        "-f", "qcow2", "-F", vm->image.disk_format,
        "-b", vm->image.disk, vm->overlay, NULL};
    char msg[QEMU_IMG_OUTPUT_MAX];
    if (run_tool(argv, msg, sizeof msg) == 0) return PV_OK;
    unlink(vm->overlay);
    vm->overlay[0] = '\0';
    msg[strcspn(msg, "\n")] = '\0';
    return pv_status_set(st, PV_INTERNAL, "image %s: qemu-img create of the root disk: %s", image,
                         msg);
}

int wk_virt_vm_prepare(const wk_virt_dirs *d, const char *id, const char *image, wk_virt_vm *out,
                       pv_status *st) {
    memset(out, 0, sizeof *out);
    char logs[PATH_MAX], images[PATH_MAX];
    int rc = state_subdir(d->state_dir, "logs", logs, sizeof logs, st);
    if (rc != PV_OK) return rc;
    wk_virt_vm_log_path(d->state_dir, id, out->log, sizeof out->log);
    if (!image || !*image) return PV_OK;
    if ((rc = state_subdir(d->state_dir, "images", images, sizeof images, st)) != PV_OK) return rc;
    pthread_mutex_lock(d->image_mu);
    rc = wk_vm_image_open(d->image_dir, image, images, &out->image, st);
    pthread_mutex_unlock(d->image_mu);
    if (rc == PV_OK && out->image.disk) rc = make_overlay(d, id, image, out, st);
    if (rc != PV_OK) wk_virt_vm_clear(out);
    return rc;
}

static void element(FILE *f, const char *name, const char *value) {
    if (!value) return;
    fprintf(f, "<%s>", name);
    wk_xml_put_escaped(f, value);
    fprintf(f, "</%s>", name);
}

void wk_virt_vm_os_xml(FILE *f, const wk_virt_vm *vm) {
    element(f, "kernel", vm->image.kernel);
    element(f, "initrd", vm->image.initrd);
    element(f, "cmdline", vm->image.cmdline);
    if (!vm->image.kernel) fputs("<boot dev='hd'/>", f);
}

void wk_virt_vm_devices_xml(FILE *f, const wk_virt_vm *vm) {
    if (vm->overlay[0]) {
        fputs("    <disk type='file' device='disk'><driver name='qemu' type='qcow2'/>"
              "<source file='",
              f);
        wk_xml_put_escaped(f, vm->overlay);
        fputs("'/><target dev='vda' bus='virtio'/></disk>\n", f);
    }
    fputs("    <interface type='user'><model type='virtio'/></interface>\n"
          "    <serial type='pty'><log file='",
          f);
    wk_xml_put_escaped(f, vm->log);
    fputs("' append='on'/><target port='0'/></serial>\n"
          "    <console type='pty'><target type='serial' port='0'/></console>\n"
          "    <channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/>"
          "</channel>\n",
          f);
}

void wk_virt_vm_remove_files(const char *overlay, const char *log) {
    if (overlay && *overlay) unlink(overlay);
    if (log && *log) {
        char idx[PATH_MAX];
        wk_virt_vm_index_path(log, idx, sizeof idx);
        unlink(log);
        unlink(idx);
        for (int i = 0; i < 10; i++) { /* what virtlogd rotated: <log>.0, <log>.1, ... */
            char old[PATH_MAX + 8];
            snprintf(old, sizeof old, "%s.%d", log, i);
            unlink(old);
        }
    }
}

void wk_virt_vm_index_now(const char *log_path, int64_t now_ms) {
    struct stat sb;
    char idx[PATH_MAX];
    wk_virt_vm_index_path(log_path, idx, sizeof idx);
    wk_log_index_append(idx, now_ms, stat(log_path, &sb) == 0 ? (int64_t)sb.st_size : 0);
}

void wk_virt_vm_index_tick(const char *state_dir, json_t *sizes, int64_t now_ms) {
    char logs[PATH_MAX];
    if ((size_t)snprintf(logs, sizeof logs, "%s/logs", state_dir) >= sizeof logs) return;
    DIR *d = opendir(logs);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        char log[PATH_MAX], idx[PATH_MAX];
        struct stat sb;
        if (n < 5 || strcmp(e->d_name + n - 4, ".log") != 0 ||
            (size_t)snprintf(log, sizeof log, "%s/%s", logs, e->d_name) >= sizeof log ||
            stat(log, &sb) != 0)
            continue;
        wk_virt_vm_index_path(log, idx, sizeof idx);
        json_t *known = json_object_get(sizes, e->d_name);
        int64_t last = known ? json_integer_value(known) : wk_log_index_last_size(idx);
        if ((int64_t)sb.st_size != last) wk_log_index_append(idx, now_ms, (int64_t)sb.st_size);
        json_object_set_new(sizes, e->d_name, json_integer((json_int_t)sb.st_size));
    }
    closedir(d);
}

/* The log that entry (a name under logs/) belongs to: <id>.log itself, its <id>.idx and what
 * virtlogd rotated (<id>.log.N); false for anything else. */
static bool log_of(const char *logs, const char *entry, char *out, size_t cap) {
    const char *dot = strstr(entry, ".log");
    size_t stem;
    if (dot && (dot[4] == '\0' || dot[4] == '.'))
        stem = (size_t)(dot - entry);
    else if ((stem = strlen(entry)) > 4 && strcmp(entry + stem - 4, ".idx") == 0)
        stem -= 4;
    else
        return false;
    return (size_t)snprintf(out, cap, "%s/%.*s.log", logs, (int)stem, entry) < cap;
}

void wk_virt_vm_sweep(const char *state_dir, bool (*kept)(const char *path, void *arg), void *arg) {
    static const char *const subs[] = {"disks", "logs"};
    for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++) {
        char dir[PATH_MAX];
        if ((size_t)snprintf(dir, sizeof dir, "%s/%s", state_dir, subs[i]) >= sizeof dir) return;
        DIR *d = opendir(dir);
        if (!d) continue;
        for (struct dirent *e; (e = readdir(d));) {
            char path[PATH_MAX], owner[PATH_MAX];
            if (e->d_name[0] == '.' ||
                (size_t)snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= sizeof path)
                continue;
            bool is_log = i == 1;
            if (is_log && !log_of(dir, e->d_name, owner, sizeof owner)) continue;
            if (!kept(is_log ? owner : path, arg)) unlink(path);
        }
        closedir(d);
    }
}
