"""End-to-end test of the system libvirtd restarted under a node agent (label vm): the guest runs
on and the agent reconnects. A virt://qemu:///system node (vmtest.py: the test guest, TCG), one
guest.

  test_libvirtd_restart  libvirtd stopped (SIGTERM) and started again as it ran before (the same
                         command line and environment, read from /proc): the guest runs on,
                         the agent's next calls reconnect (exec, suspend and resume work
                         again), libvirtd runs as it did, virtlogd is the same process, and the
                         domains of other clients that ran before run on
  test_calls_while_down  calls issued while libvirtd is down (stopped, started again 3 s
                         later, as a package upgrade does) succeed once it is back, instead of
                         failing on the closed connection: a ControlWorkload restart (stop,
                         then start: the guest boots again and its agent answers), then a
                         RemoveWorkload (the domain is gone)

Every libvirt client of the machine sees the restart, so ctest runs this module alone
(RUN_SERIAL in tests/CMakeLists.txt: no other test of that ctest runs meanwhile). Another
ctest on the same machine (another checkout) still sees a blip: its libvirt calls of that
moment fail once and reconnect, as this agent's do.
"""
import os
import signal
import subprocess
import threading
import time

import pvtest
import vmtest
from pb import core_pb2
from vmtest import VIRSH, Base

POD = "vrp"
NODE = "vrq1"
PID_FILE = "/run/libvirtd.pid"

setUpModule, tearDownModule = vmtest.fixtures(POD, NODE, "vrt")


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
        self.assertEqual(proc_strings(new, "cmdline"), argv)
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
        self.wait_agent(wid, timeout=30)
        self.control(wid, "suspend")
        self.assertTrue(self.domstate(msg.name).startswith("paused"))
        self.control(wid, "resume")
        self.wait_agent(wid)
        with open(self.stack.agents[0].log_path) as f:
            self.assertIn("reconnected", f.read())
        self.remove(wid)

    def while_down(self, call):
        """Runs call() in a thread issued while libvirtd is down, starts libvirtd again 3 s
        later; returns what call returned (or raises what it raised) and the seconds it took."""
        got = {}

        def run():
            t0 = time.monotonic()
            try:
                got["value"] = call()
            except Exception as e:  # re-raised below, in the test's thread
                got["error"] = e
            got["seconds"] = time.monotonic() - t0

        pid, argv, env = stop_libvirtd()
        th = threading.Thread(target=run)
        try:
            self.assertFalse(os.path.exists("/proc/%d" % pid), "libvirtd did not stop")
            th.start()
            time.sleep(3)
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
            core_pb2.RemoveWorkloadOptions(IDs=[wid], force=True), timeout=120)))
        vmtest.say("RemoveWorkload issued while libvirtd was down: %.1f s" % secs)
        self.assertEqual([(g.id, g.success, g.hook) for g in got], [(wid, True, "")])
        self.assertIsNone(self.domstate(msg.name))


if __name__ == "__main__":
    pvtest.main()
