"""End-to-end test of the system libvirtd restarted under a node agent (label vm): the guest runs
on and the agent reconnects. A virt://qemu:///system node (vmtest.py: the test guest, TCG), one
guest.

  test_libvirtd_restart  libvirtd stopped (SIGTERM) and started again as it ran before (the same
                         command line and environment, read from /proc): the guest runs on,
                         the agent's next calls reconnect (exec, suspend and resume work
                         again), libvirtd runs as it did, virtlogd is the same process, and the
                         domains of other clients that ran before run on
  test_calls_while_down  calls issued while libvirtd is down succeed once it is back, instead
                         of failing on the closed connection: a ControlWorkload restart (stop,
                         then start: the guest boots again and its agent answers) with
                         libvirtd started again 3 s later, as a package upgrade does (the
                         engine waits for it and runs the call again); then a RemoveWorkload
                         with libvirtd away 25 s, longer than the engine waits (10 s per
                         call): the engine fails the node operation UNAVAILABLE, the operation
                         is retried later and removes the domain. The 25 s are the relay's
                         (below), not the system libvirtd's: another test of the machine that
                         finds libvirtd down starts it again (pvtest.ensure_libvirtd), and the
                         other checkouts' tests should not wait for this one

The agent reaches libvirtd through a relay of this module's (Relay: qemu:///system?socket=...
on a unix socket of its own, forwarding to libvirtd's): the relay going down closes the agent's
connections and refuses new ones, as a libvirtd stopped does, without touching libvirtd.

Every libvirt client of the machine sees the restart, so ctest runs this module alone
(RUN_SERIAL in tests/CMakeLists.txt: no other test of that ctest runs meanwhile). Another
ctest on the same machine (another checkout) still sees a blip: its libvirt calls of that
moment wait for libvirtd and run again on a new connection, as this agent's do (or fail
once, with a build older than that).
"""
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time

import pvtest
import vmtest
from pb import core_pb2
from vmtest import VIRSH, Base

POD = "vrp"
NODE = "vrq1"
PID_FILE = "/run/libvirtd.pid"

LIBVIRT_SOCK = "/run/libvirt/libvirt-sock"


class Relay:
    """A unix socket forwarding each connection to libvirtd's. down() closes every forwarded
    connection and the socket (a connect then fails, as with no libvirtd); up() listens again."""

    def __init__(self, path):
        self.path = path
        self.lock = threading.Lock()
        self.listener = None
        self.conns = []

    def up(self):
        if os.path.exists(self.path):
            os.unlink(self.path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path)
        listener.listen(16)
        with self.lock:
            self.listener = listener
        threading.Thread(target=self.accept, args=(listener,), daemon=True).start()

    def down(self):
        with self.lock:
            listener, conns, self.listener, self.conns = self.listener, self.conns, None, []
        for s in ([listener] if listener else []) + conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        if os.path.exists(self.path):
            os.unlink(self.path)

    def accept(self, listener):
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # down
            daemon = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                daemon.connect(LIBVIRT_SOCK)
            except OSError:
                client.close()
                daemon.close()
                continue
            with self.lock:
                if self.listener is not listener:  # went down meanwhile
                    client.close()
                    daemon.close()
                    return
                self.conns += [client, daemon]
            for a, b in ((client, daemon), (daemon, client)):
                threading.Thread(target=self.pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def pipe(src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


RELAY = Relay(os.path.join(tempfile.gettempdir(), "pv-vrt-relay-%d.sock" % os.getpid()))


def setUpModule():
    RELAY.up()
    vmtest.start_stack(POD, NODE, "vrt", uri="qemu:///system?socket=" + RELAY.path)


def tearDownModule():
    try:
        vmtest.stop_stack()
    finally:
        RELAY.down()


def read_pid(path):
    with open(path) as f:
        return int(f.read().strip())


def proc_strings(pid, what):
    with open("/proc/%d/%s" % (pid, what), "rb") as f:
        return [x.decode() for x in f.read().split(b"\0") if x]


def running_domains():
    return set(subprocess.run(VIRSH + ["list", "--name", "--state-running"], capture_output=True,
                              text=True).stdout.split())


def start_as_before(argv, env):
    """libvirtd as it ran: its command line (-d: it daemonizes, as ops/pivirt starts it) and its
    environment, no descriptor of ours inherited. Returns an error text or None."""
    subprocess.run(argv, env=dict(e.split("=", 1) for e in env if "=" in e), cwd="/",
                   close_fds=True, capture_output=True, timeout=30)
    return pvtest.ensure_libvirtd()


def stop_libvirtd():
    """SIGTERM to the system libvirtd, waiting until it is gone. Returns (pid, argv, env): how
    it ran, for start_as_before."""
    pid = read_pid(PID_FILE)
    argv, env = proc_strings(pid, "cmdline"), proc_strings(pid, "environ")
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    while os.path.exists("/proc/%d" % pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return pid, argv, env


class LibvirtdRestart(Base):
    def test_libvirtd_restart(self):
        msg, _ = self.create("vrtrestart")
        wid = msg.id
        self.wait_agent(wid)
        virtlogd = read_pid("/run/virtlogd.pid")
        others = running_domains() - {msg.name}
        pid, argv, env = stop_libvirtd()
        try:
            self.assertFalse(os.path.exists("/proc/%d" % pid), "libvirtd did not stop")
        finally:
            # whatever failed, libvirtd runs again as it did: the machine's other tests need it
            self.assertIsNone(start_as_before(argv, env))
        new = read_pid(PID_FILE)
        self.assertNotEqual(new, pid)
        # the same program and arguments (another checkout's test that found libvirtd down
        # meanwhile may have started it first, by its full path: pvtest.ensure_libvirtd)
        now = proc_strings(new, "cmdline")
        self.assertEqual([os.path.basename(now[0])] + now[1:],
                         [os.path.basename(argv[0])] + argv[1:])
        self.assertEqual(read_pid("/run/virtlogd.pid"), virtlogd)
        self.assertTrue(vmtest.virtlogd_answers())
        self.assertTrue(self.domstate(msg.name).startswith("running"))
        # the other clients' domains of before that still exist run on (their tests may have
        # removed some meanwhile)
        still = running_domains()
        for name in others:
            state = self.domstate(name)
            if state is not None and not state.startswith("shut off"):
                self.assertIn(name, still, state)
        # the first call on the closed connection may fail; the agent reconnects
        self.usable_after_reconnect(wid, msg.name)
        self.remove(wid)

    def while_down(self, call, down_seconds=3, relay=False):
        """Runs call() in a thread issued while libvirtd is down (relay: while the relay is),
        starts libvirtd (the relay) again down_seconds later; returns what call returned (or
        raises what it raised) and the seconds it took."""
        got = {}

        def run():
            t0 = time.monotonic()
            try:
                got["value"] = call()
            except Exception as e:  # re-raised below, in the test's thread
                got["error"] = e
            got["seconds"] = time.monotonic() - t0

        th = threading.Thread(target=run)
        if relay:
            RELAY.down()
            try:
                th.start()
                time.sleep(down_seconds)
            finally:
                RELAY.up()
        else:
            pid, argv, env = stop_libvirtd()
            try:
                self.assertFalse(os.path.exists("/proc/%d" % pid), "libvirtd did not stop")
                th.start()
                time.sleep(down_seconds)
            finally:
                self.assertIsNone(start_as_before(argv, env))
        th.join(150)
        self.assertFalse(th.is_alive(), "the call issued while libvirtd was down never ended")
        if "error" in got:
            raise got["error"]
        return got["value"], got["seconds"]

    def test_calls_while_down(self):
        msg, _ = self.create("vrtdown")
        wid = msg.id
        self.wait_agent(wid)
        got, secs = self.while_down(lambda: list(self.core.ControlWorkload(
            core_pb2.ControlWorkloadOptions(IDs=[wid], type="restart"), timeout=120)))
        vmtest.say("ControlWorkload restart issued while libvirtd was down: %.1f s" % secs)
        self.assertEqual([(g.id, g.error) for g in got], [(wid, "")])
        self.assertTrue(self.domstate(msg.name).startswith("running"))
        self.wait_agent(wid, timeout=60)
        got, secs = self.while_down(lambda: list(self.core.RemoveWorkload(
            core_pb2.RemoveWorkloadOptions(IDs=[wid], force=True), timeout=120)), 25, relay=True)
        vmtest.say("RemoveWorkload issued while libvirtd was away 25 s: %.1f s" % secs)
        self.assertEqual([(g.id, g.success, g.hook) for g in got], [(wid, True, "")])
        self.assertIsNone(self.domstate(msg.name))
        with open(self.stack.agents[0].log_path) as f:
            log = f.read()
        # the engine's waits (10 s per call: the fence's look at the workload, then the stop)
        # ran out: the node operation failed UNAVAILABLE, was retried later and removed it
        self.assertRegex(log, r"kind=workload\.remove_on_node attempt=1 outcome=retry .*"
                              r"code=UNAVAILABLE msg=\"remove %s: libvirt \S+: \w+ lost its "
                              r"connection .*did not answer again within 10\.0 s" % wid)
        self.assertRegex(log, r"kind=workload\.remove_on_node attempt=2 outcome=SUCCEEDED")


if __name__ == "__main__":
    pvtest.main()
