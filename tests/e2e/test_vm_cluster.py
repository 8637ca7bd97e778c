"""End-to-end tests of ClusterService's DrainNode and UpgradeCluster on a cluster of VM nodes
(label vm): real guests move between nodes like any workload.

Two node agents (vcq1, vcq2) of pod/cluster "vcp" on the same qemu:///system (one libvirtd;
each agent sees only the domains its own state directory owns: vmtest.py), the test guest
cached on both. Two guests of 128 MiB; a move places the replacement before it stops the old
one, so three run at once for a moment (the other VM modules keep one).

  test_a_drain_moves_the_vms
      two VMs deployed on vcq1; DrainNode of vcq1: SUCCEEDED, "2 workload(s) moved", the node
      CORDONED; the app has two new workloads, both on vcq2, whose domains run there and whose
      guest agents answer an exec (the moved VMs booted); the old workloads' records are gone
      and vcq1 holds no domain (libvirt's list, and its agent's report in Node.info); pivirt
      check clean. vcq1 is uncordoned at the end.
  test_b_upgrade_rolls_through_the_vm_nodes
      UpgradeCluster ROLLING one node at a time (max_surge 1) to a new version: SUCCEEDED,
      both nodes UPGRADED at it and READY, the cluster at the version; vcq2's VMs moved onto
      vcq1 while vcq2 was upgraded (vcq1 came first and was empty): the app ends with two
      running VMs on vcq1 whose guest agents answer, none lost, vcq2 without a domain, the
      audit clean.
"""
import json
import os
import subprocess
import time
import xml.etree.ElementTree as ET

import grpc

import pvtest
import vmtest
from vmtest import VIRSH, XMLNS, Base, say
from pb import core_pb2
from pivirt.cluster.v1 import cluster_pb2 as C, cluster_pb2_grpc
from pivirt.operations.v1 import operations_pb2 as O, operations_pb2_grpc

POD = "vcp"
NODES = ("vcq1", "vcq2")
PREFIX = "vct"
APP = "vcta"


def setUpModule():
    hook = os.path.join(pvtest.SOURCE_DIR, "ops", "hooks", "node-upgrade")
    vmtest.start_stack(POD, NODES[0], PREFIX, more_nodes=NODES[1:], config={
        "worker": {"heartbeat_seconds": 1},
        "upgrade": {"hook": hook, "node_timeout_seconds": 120, "settle_seconds": 1}})


def tearDownModule():
    vmtest.stop_stack()


def owner_of(name):
    """The state directory of the agent that owns domain name (its pivirt metadata), or None."""
    r = subprocess.run(VIRSH + ["metadata", name, "--uri", XMLNS], capture_output=True, text=True)
    if r.returncode != 0 or not r.stdout.strip():
        return None
    try:
        return json.loads(ET.fromstring(r.stdout).text or "{}").get("owner")
    except (ET.ParseError, ValueError):
        return None


class Cluster(Base):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        ch = cls.stack.channel(0)
        cls.cs = cluster_pb2_grpc.ClusterServiceStub(ch)
        cls.ops = operations_pb2_grpc.OperationServiceStub(ch)

    def node(self, name):
        return self.cs.GetNode(C.GetNodeRequest(cluster_id=POD, node_id=name), timeout=10)

    def node_domains(self, node):
        """The domains (any state) of node's agent on the libvirtd."""
        state = os.path.join(self.stack.data_dir, "engine", node)
        return sorted(n for n in vmtest.domains(PREFIX) if owner_of(n) == state)

    def app(self):
        return {w.id: w for w in self.core.ListWorkloads(
            core_pb2.ListWorkloadsOptions(appname=APP), timeout=10)}

    def reported(self, node):
        """The workloads node's agent reports in Node.info's "virt" section: {id: state}."""
        n = self.core.GetNode(core_pb2.GetNodeOptions(nodename=node), timeout=10)
        virt = json.loads(n.info or "{}").get("virt", {})
        return {k: v.get("state") for k, v in virt.get("workloads", {}).items()}

    def until(self, what, fn, timeout=60):
        deadline = time.monotonic() + timeout
        got = fn()
        while not got and time.monotonic() < deadline:
            time.sleep(0.5)
            got = fn()
        self.assertTrue(got, what)
        return got

    def wait_op(self, op_id, timeout):
        deadline = time.monotonic() + timeout
        while True:
            cur = self.ops.WaitOperation(O.WaitOperationRequest(id=op_id, timeout_seconds=30),
                                         timeout=40)
            if cur.done:
                return cur
            if time.monotonic() > deadline:
                self.fail("operation %s still running after %ds: %s" % (op_id, timeout, cur))

    def assert_runs_on(self, node, want=2):
        """The app has want workloads, all on node, each domain of node's agent running there
        with its guest agent answering; returns their ids."""
        app = self.app()
        self.assertEqual(len(app), want, app)
        self.assertEqual({w.nodename for w in app.values()}, {node}, app)
        doms = self.node_domains(node)
        for wid, w in app.items():
            self.assertIn(w.name, doms)
            self.assertEqual(self.domstate(w.name), "running (booted)")
            self.wait_agent(wid, timeout=120)
            out, code = self.execute(wid, ["/bin/sh", "-c", "echo moved-$(uname -s)"])
            self.assertEqual((out, code), ("moved-Linux\n", "[exitcode] 0"))
        # the agent's status pass has them too (what the audit compares)
        self.until("%s reports %s running" % (node, sorted(app)),
                   lambda: all(self.reported(node).get(wid) == "running" for wid in app))
        return set(app)

    def assert_clean(self):
        # the status passes settle after the moves: an audit until clean, with a deadline
        deadline = time.monotonic() + 30
        diffs = self.stack.check()
        while diffs and time.monotonic() < deadline:
            time.sleep(1)
            diffs = self.stack.check()
        self.assertEqual(diffs, [])

    def test_a_drain_moves_the_vms(self):
        self.until("both nodes READY", lambda: all(
            self.node(n).status == C.NODE_STATUS_READY for n in NODES))
        # half a CPU each: both fit on one node of a one-core machine (one vcpu each still)
        opts = vmtest.deploy(APP, memory="128M", cpus=0.5)
        opts.count = 2
        opts.nodenames[:] = [NODES[0]]
        msgs = list(self.core.CreateWorkload(opts, timeout=300))
        self.assertEqual(len(msgs), 2, msgs)
        self.assertTrue(all(m.success for m in msgs), msgs)
        old = {m.id: m.name for m in msgs}
        self.assertEqual(self.node_domains(NODES[0]), sorted(old.values()))
        for wid in old:
            self.wait_agent(wid, timeout=120)
        t0 = time.monotonic()
        op = self.cs.DrainNode(C.DrainNodeRequest(cluster_id=POD, node_id=NODES[0],
                                                  grace_period_seconds=30), timeout=10)
        self.assertEqual(op.kind, "node.drain")
        done = self.wait_op(op.id, timeout=400)
        say("drain of %s with two VMs: %.1f s" % (NODES[0], time.monotonic() - t0))
        self.assertEqual(done.status, O.OPERATION_STATUS_SUCCEEDED, done)
        self.assertIn("2 workload(s) moved, 0 removed", done.message)
        self.assertEqual(self.node(NODES[0]).status, C.NODE_STATUS_CORDONED)
        now = self.assert_runs_on(NODES[1])
        self.assertFalse(now & set(old), (now, old))
        for wid in old:
            with self.assertRaises(grpc.RpcError):
                self.core.GetWorkload(core_pb2.WorkloadID(id=wid), timeout=10)
        self.assertEqual(self.node_domains(NODES[0]), [])
        self.until("%s reports no workload" % NODES[0], lambda: self.reported(NODES[0]) == {})
        self.assert_clean()
        op = self.cs.UncordonNode(C.UncordonNodeRequest(cluster_id=POD, node_id=NODES[0]),
                                  timeout=10)
        self.assertTrue(op.done)

    def test_b_upgrade_rolls_through_the_vm_nodes(self):
        before = self.app()
        self.assertEqual({w.nodename for w in before.values()}, {NODES[1]}, before)
        c = self.cs.GetCluster(C.GetClusterRequest(cluster_id=POD), timeout=10)
        target = "v1.1.0"  # a pod made by its agents has no version yet: any target is new
        self.assertNotEqual(c.version, target)
        t0 = time.monotonic()
        op = self.cs.UpgradeCluster(C.UpgradeClusterRequest(
            cluster_id=POD, target_version=target,
            strategy=C.UpgradeStrategy(type=C.UPGRADE_TYPE_ROLLING, max_surge=1,
                                       max_unavailable=1)), timeout=10)
        self.assertEqual(op.kind, "cluster.upgrade")
        done = self.wait_op(op.id, timeout=500)
        say("rolling upgrade %s -> %s of two VM nodes: %.1f s" % (c.version, target,
                                                                  time.monotonic() - t0))
        self.assertEqual(done.status, O.OPERATION_STATUS_SUCCEEDED, done)
        s = self.cs.GetUpgradeStatus(C.GetUpgradeStatusRequest(cluster_id=POD), timeout=10)
        self.assertEqual((s.phase, s.from_version, s.to_version),
                         (C.UPGRADE_PHASE_SUCCEEDED, c.version, target))
        self.assertEqual([(n.node_name, n.state, n.version) for n in s.nodes],
                         [(n, C.NODE_UPGRADE_STATE_UPGRADED, target) for n in NODES])
        c = self.cs.GetCluster(C.GetClusterRequest(cluster_id=POD), timeout=10)
        self.assertEqual((c.version, c.status), (target, C.CLUSTER_STATUS_RUNNING))
        for n in NODES:
            got = self.node(n)
            self.assertEqual((got.status, got.annotations["pivirt.io/version"]),
                             (C.NODE_STATUS_READY, target))
        # vcq1 went first (empty), then vcq2's VMs moved onto it
        now = self.assert_runs_on(NODES[0])
        self.assertFalse(now & set(before))
        self.assertEqual(self.node_domains(NODES[1]), [])
        self.until("%s reports no workload" % NODES[1], lambda: self.reported(NODES[1]) == {})
        self.assert_clean()
        for wid in now:
            self.remove(wid)
        self.assertEqual(vmtest.domains(PREFIX), [])


if __name__ == "__main__":
    pvtest.main()
