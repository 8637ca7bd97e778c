"""End-to-end tests of the self-fencing of QEMU domains (label vm): a node whose agent cannot
renew its liveness lease stops its HA VMs (label pivirt.io/ha=restart) once ha.fence_seconds
have passed, and leaves the others running.

Two virt://qemu:///system nodes of one pod on the same libvirtd (vmtest.py: the test guest,
TCG), beat 1 s, fence 3 s, node timeout 8 s; the guests run on vhq1. Two guests at once (192
MiB each): one HA-labelled, one not; run this module alone, not beside another VM module
(vmtest.py keeps one guest per module otherwise).

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
  test_c_failover
      the agent of vhq1 frozen past the node timeout: its guard kills the HA domain's qemu, and
      the failover recreates the VM on vhq2 (same id, epoch 2; its domain named
      "<name>.2", as the lost node's domain still holds the name on this shared libvirtd); its
      guest agent answers an exec there, and its qemu started after the old one was killed
      (zero overlap: the fence log's ms against the new qemu's start). The unlabelled VM runs
      on vhq1 throughout; resumed, vhq1 removes its stale domain. One trial (slow guests).
"""
import json
import os
import signal
import time
import unittest

import vmtest
from pvnet import wait_for
from vmtest import Base, deploy
from pb import core_pb2
from pivirt.cluster.v1 import cluster_pb2, cluster_pb2_grpc

POD = "vhp"
NODE = "vhq1"
FENCE, TIMEOUT = 3, 8


def setUpModule():
    vmtest.start_stack(POD, NODE, "vht", more_nodes=("vhq2",), config={
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
        # vhq2 cordoned until test_c: a slow renewal after a test's freeze must not move the
        # VMs there (as with one node, a failover then has nowhere to go)
        cls.cs = cluster_pb2_grpc.ClusterServiceStub(cls.stack.channel(0))
        cls.cs.CordonNode(cluster_pb2.CordonNodeRequest(cluster_id=POD, node_id="vhq2"),
                          timeout=30)
        cls.ids = {}
        for name, ha in (("vhtha", True), ("vhtplain", False)):
            opts = deploy(name)
            opts.nodenames.append(NODE)
            if ha:
                opts.labels["pivirt.io/ha"] = "restart"
            msgs = list(cls.core.CreateWorkload(opts, timeout=180))
            assert len(msgs) == 1 and msgs[0].success, msgs
            cls.ids[name] = (msgs[0].id, msgs[0].name)

    @classmethod
    def tearDownClass(cls):
        # removed before the stack stops: an HA workload left behind would be failed over while
        # the agents stop, after the module's domains were cleaned up
        for wid, _dom in cls.ids.values():
            try:
                list(cls.core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(
                    IDs=[wid], force=True), timeout=120))
            except Exception as e:  # noqa: BLE001 - stop_stack destroys what is left
                print("tearDown: %s not removed: %s" % (wid, e))
        super().tearDownClass()

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

    def test_c_failover(self):
        self.both_running()
        op = self.cs.UncordonNode(cluster_pb2.UncordonNodeRequest(cluster_id=POD,
                                                                  node_id="vhq2"), timeout=30)
        self.assertTrue(op.done, op)
        wid, old_dom = self.ids["vhtha"]
        plain_dom = self.ids["vhtplain"][1]
        n_before = len(self.fence_log())
        t0 = time.monotonic()
        self.agent.send_signal(signal.SIGSTOP)
        try:
            wait_for("the HA domain fenced", lambda: not running(self.domstate(old_dom)),
                     timeout=FENCE + 10)
            t_fenced = time.monotonic() - t0

            def moved():
                flat = self.stack.redis.cmd("HGETALL", self.stack.key("{reg}:wl:" + wid))
                r = dict(zip(flat[::2], flat[1::2]))
                text = self.stack.redis.cmd("GET", self.stack.key("{reg}:wl-status:" + wid))
                return (r.get("node"), r.get("epoch")) == ("vhq2", "2") and text and \
                    json.loads(text).get("running")
            wait_for("the HA VM running on vhq2", moved, timeout=120)
            t_back = time.monotonic() - t0
            self.wait_agent(wid, timeout=120)
            t_agent = time.monotonic() - t0
            self.assertTrue(running(self.domstate(plain_dom)), self.domstate(plain_dom))
        finally:
            self.agent.send_signal(signal.SIGCONT)
        new_dom = old_dom + ".2"
        self.assertTrue(running(self.domstate(new_dom)), self.domstate(new_dom))
        fenced = [int(f[0]) for f in self.fence_log()[n_before:]
                  if f[1] == "fence" and f[2] == wid]
        self.assertTrue(fenced, self.fence_log()[n_before:])
        started = proc_start_ms(qemu_pid(new_dom))
        self.assertLess(min(fenced), started)  # zero overlap: the old qemu killed first
        wait_for("the stale domain removed from vhq1", lambda: self.domstate(old_dom) is None,
                 timeout=60)
        self.assertTrue(running(self.domstate(plain_dom)), self.domstate(plain_dom))
        print("\nVM failover: old qemu killed %.1f s after the freeze, the VM running on vhq2 "
              "after %.1f s, its guest agent answering after %.1f s; old killed %d ms before "
              "the new qemu started" % (t_fenced, t_back, t_agent, started - min(fenced)))


def proc_start_ms(pid):
    """When process pid started, in ms since the epoch (its /proc stat start time and btime)."""
    with open("/proc/%d/stat" % pid) as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/stat") as f:
        btime = [int(line.split()[1]) for line in f if line.startswith("btime")][0]
    return btime * 1000 + ticks * 1000 // os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    unittest.main(verbosity=2)
