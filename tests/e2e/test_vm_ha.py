"""End-to-end tests of the self-fencing of QEMU domains (label vm): a node whose agent cannot
renew its liveness lease stops its HA VMs (label pivirt.io/ha=restart) once ha.fence_seconds
have passed, and leaves the others running.

A single virt://qemu:///system node (vmtest.py: the test guest, TCG), beat 1 s, fence 3 s,
node timeout 8 s. Two guests at once (192 MiB each): one HA-labelled, one not; run this module
alone, not beside another VM module (vmtest.py keeps one guest per module otherwise).

  test_a_guard_kills_qemu
      the agent alone frozen (SIGSTOP): its guard, which needs neither the agent nor Redis nor
      libvirtd, SIGKILLs the HA domain's qemu process (its pid from libvirtd's
      /run/libvirt/qemu/<domain>.pid, given to the guard by the agent) after the fence time;
      the domain is shut off ("crashed"), the unlabelled one runs on; the fence log names it.
      Resumed before the node timeout, the agent renews and, the registry still calling the VM
      this node's, starts it again.
  test_b_agent_destroys
      Redis frozen (SIGSTOP): the agent runs but cannot renew; after the fence time its fence
      destroys the HA domain through libvirt (or its guard kills qemu, whichever comes first),
      the unlabelled one runs on.
"""
import os
import signal
import time
import unittest

import vmtest
from pvnet import wait_for
from vmtest import Base, deploy

POD = "vhp"
NODE = "vhq1"
FENCE, TIMEOUT = 3, 8


def setUpModule():
    vmtest.start_stack(POD, NODE, "vht", config={
        "worker": {"heartbeat_seconds": 1},
        "ha": {"node_timeout_seconds": TIMEOUT, "fence_seconds": FENCE}})


def tearDownModule():
    vmtest.stop_stack()


def qemu_pid(domain):
    try:
        with open("/run/libvirt/qemu/%s.pid" % domain) as f:
            return int(f.read().strip())
    except (FileNotFoundError, ValueError):
        return 0


def running(state):
    return bool(state) and state.startswith("running")


class VMHA(Base):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.agent = cls.stack.agents[0]
        cls.ids = {}
        for name, ha in (("vhtha", True), ("vhtplain", False)):
            opts = deploy(name)
            if ha:
                opts.labels["pivirt.io/ha"] = "restart"
            msgs = list(cls.core.CreateWorkload(opts, timeout=180))
            assert len(msgs) == 1 and msgs[0].success, msgs
            cls.ids[name] = (msgs[0].id, msgs[0].name)

    def fence_log(self):
        try:
            with open(os.path.join(self.stack.data_dir, "node", NODE, "fence.log")) as f:
                return [line.split(None, 5) for line in f]
        except FileNotFoundError:
            return []

    def both_running(self):
        for _wid, dom in self.ids.values():
            wait_for("%s running" % dom, lambda d=dom: running(self.domstate(d)), timeout=120)

    def frozen(self, proc, expect_how):
        """proc SIGSTOPped: the HA domain is shut off within the fence time (plus the guard's
        lag and a margin for a loaded machine), the plain one runs throughout."""
        wid, ha_dom = self.ids["vhtha"]
        plain_dom = self.ids["vhtplain"][1]
        pid = qemu_pid(ha_dom)
        self.assertGreater(pid, 0)
        n_before = len(self.fence_log())
        t0 = time.monotonic()
        proc.send_signal(signal.SIGSTOP)
        try:
            wait_for("the HA domain fenced", lambda: not running(self.domstate(ha_dom)),
                     timeout=FENCE + 10)
            t_fenced = time.monotonic() - t0
            self.assertFalse(os.path.exists("/proc/%d" % pid) and
                             open("/proc/%d/stat" % pid).read().split()[2] not in "ZX")
            self.assertTrue(running(self.domstate(plain_dom)), self.domstate(plain_dom))
        finally:
            proc.send_signal(signal.SIGCONT)
        self.assertGreaterEqual(t_fenced, FENCE - 1)
        self.assertLess(t_fenced, TIMEOUT)  # before the cluster may recreate it
        log = self.fence_log()[n_before:]
        fenced = [f for f in log if f[1] == "fence" and f[2] == wid]
        self.assertTrue(fenced, log)
        self.assertTrue(any(expect_how in f[5] for f in fenced), fenced)
        self.assertEqual([f for f in log if f[1] == "fence" and f[2] == self.ids["vhtplain"][0]],
                         [])
        print("\n%s: HA domain off %.1f s after the freeze; %s" % (
            self._testMethodName, t_fenced, [f[5].strip() for f in fenced]))
        return t_fenced

    def test_a_guard_kills_qemu(self):
        self.both_running()
        self.frozen(self.agent, "guard SIGKILL")
        # resumed before the node timeout: still this node's, started again
        wait_for("the HA domain started again",
                 lambda: running(self.domstate(self.ids["vhtha"][1])), timeout=60)
        wid = self.ids["vhtha"][0]
        wait_for("its resumption logged", lambda: any(
            f[1] == "resumed" and f[2] == wid for f in self.fence_log()), timeout=30)

    def test_b_agent_destroys(self):
        self.both_running()
        # the agent's own fence, or its guard: either stops the domain
        self.frozen(self.stack.redis.proc, "")


if __name__ == "__main__":
    unittest.main(verbosity=2)
