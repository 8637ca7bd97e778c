#!/usr/bin/python3
"""End-to-end tests of ClusterService's UpgradeCluster and GetUpgradeStatus with live node
agents.

Four agents (u1..u4) join cluster "upg" at v1.0.0, plus node-01 for the seed's example. Their
upgrade hook (upgrade.hook) is a test wrapper around the project's ops/hooks/node-upgrade: it
fails on a node when a file fail-<node>-<version> exists beside it, and takes a second when a
file "slow" does. A two-instance app runs in the cluster, so every node's drain moves work.

  test_a  ROLLING, two nodes per batch: UPGRADING seen (cluster and phase), every node
          UPGRADED at the target (its pivirt.io/version annotation too), batches 1,1,2,2, the
          cluster at the target and RUNNING, the app still at two instances.
  test_b  CANARY with partition 1: the first node SKIPPED at the old version, the canary alone
          in batch 1 and watched (VERIFYING), the rest after; the cluster at the target.
  test_c  BLUE_GREEN: the first half upgraded and verified, every workload MIGRATING onto it,
          then the other half: the app ends up on the first half.
  test_d  a hook that fails on u3 stops the rollout and rolls u1..u3 back: the operation FAILED
          naming u3 and the hook's words, phase ROLLED_BACK, every node READY at the old
          version and uncordoned, u4 never touched, the cluster's version unchanged.
  test_e  CancelOperation midway: CANCELLED, the touched nodes back at the old version.
  test_ez a rollback that fails too (the hook refuses the old version on u1): phase FAILED,
          the cluster and u1 in ERROR until the operator uncordons it and upgrades again.
  test_f  bad requests: the codes and the fields they name.
  test_g  the seed's UpgradeCluster example as written, through buf curl and reflection, on a
          one-node cluster (max_unavailable 0, max_surge 1: its node upgrades alone); the cluster
          is recorded formed by the schedulers' tick before anyone reads it.
"""
import json
import os
import tarfile
import tempfile
import time
import unittest

import grpc

import pvtest
from pb import core_pb2, core_pb2_grpc
from pivirt.cluster.v1 import cluster_pb2, cluster_pb2_grpc
from pivirt.operations.v1 import operations_pb2, operations_pb2_grpc

C = cluster_pb2
O = operations_pb2
NODES = ("u1", "u2", "u3", "u4")
_stack = None
_hooks = None


def setUpModule():
    global _stack, _hooks
    _hooks = tempfile.TemporaryDirectory(prefix="pvhooks-")
    hook = os.path.join(_hooks.name, "hook.sh")
    default = os.path.join(os.environ.get("PV_SOURCE_DIR", os.getcwd()), "ops", "hooks",
                           "node-upgrade")
    with open(hook, "w") as f:
        f.write('#!/bin/sh\nd=$(dirname "$0")\n'
                'if [ -e "$d/fail-$PIVIRT_NODE-$1" ]; then echo "disk full on $PIVIRT_NODE" >&2;'
                ' exit 3; fi\n'
                '[ -e "$d/slow" ] && sleep 1\n'
                'exec %s "$1"\n' % default)
    os.chmod(hook, 0o755)
    _stack = pvtest.Stack(gateways=1, workers=2, schedulers=1,
                          agents=[(n, "") for n in NODES + ("node-01",)],
                          config={"worker": {"heartbeat_seconds": 1, "stop_grace_seconds": 1},
                                  "upgrade": {"hook": hook, "node_timeout_seconds": 15,
                                              "settle_seconds": 1}})
    _stack.start()
    image = os.path.join(_stack.data_dir, "images", "up", "1.tar")
    os.makedirs(os.path.dirname(image), exist_ok=True)
    with tempfile.TemporaryDirectory() as root:
        script = os.path.join(root, "run.sh")
        with open(script, "w") as f:
            f.write("#!/bin/sh\nexec sleep 600\n")
        os.chmod(script, 0o755)
        with tarfile.open(image, "w") as t:
            t.add(script, arcname="run.sh")


def tearDownModule():
    _stack.stop()
    _hooks.cleanup()


class Upgrade(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stack = _stack
        ch = cls.stack.channel(0)
        cls.cs = cluster_pb2_grpc.ClusterServiceStub(ch)
        cls.core = core_pb2_grpc.CoreRPCStub(ch)
        cls.ops = operations_pb2_grpc.OperationServiceStub(ch)
        cls.cs.CreateCluster(C.CreateClusterRequest(name="upg", version="v1.0.0"), timeout=10)
        for i, n in enumerate(NODES):
            cls.cs.AddNode(C.AddNodeRequest(cluster_id="upg", name=n, ip="10.3.0.%d" % (i + 1),
                                            role=C.NODE_ROLE_WORKER), timeout=10)
        cls.wait(lambda: all(cls.node(n).status == C.NODE_STATUS_READY and
                             cls.node(n).resources.memory_bytes > 0 for n in NODES))
        opts = core_pb2.DeployOptions(
            name="svc", entrypoint=core_pb2.EntrypointOptions(name="web",
                                                             commands=["/bin/sh", "run.sh"]),
            podname="upg", image="up:1", count=2,
            resources={"cpumem": json.dumps({"memory-request": "16M"}).encode()})
        msgs = list(cls.core.CreateWorkload(opts, timeout=60))
        assert all(m.success for m in msgs), msgs

    @staticmethod
    def wait(fn, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if fn():
                return True
            time.sleep(0.2)
        return False

    @classmethod
    def node(cls, name, cluster="upg"):
        return cls.cs.GetNode(C.GetNodeRequest(cluster_id=cluster, node_id=name), timeout=10)

    def cluster(self, name="upg"):
        return self.cs.GetCluster(C.GetClusterRequest(cluster_id=name), timeout=10)

    def status(self, name="upg"):
        return self.cs.GetUpgradeStatus(C.GetUpgradeStatusRequest(cluster_id=name), timeout=10)

    def app(self):
        return sorted(w.nodename for w in self.core.ListWorkloads(
            core_pb2.ListWorkloadsOptions(appname="svc"), timeout=10))

    def err(self, fn, req):
        with self.assertRaises(grpc.RpcError) as e:
            fn(req, timeout=10)
        return e.exception.code(), e.exception.details()

    def upgrade(self, version, **strategy):
        return self.cs.UpgradeCluster(C.UpgradeClusterRequest(
            cluster_id="upg", target_version=version,
            strategy=C.UpgradeStrategy(**strategy)), timeout=10)

    def follow(self, op, timeout=90, on_status=None):
        """Polls GetUpgradeStatus and GetCluster until the operation ends: (phases, cluster
        statuses seen, the operation's end)."""
        phases, statuses = [], set()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s = self.status()
            if s.operation_id == op.id and (not phases or phases[-1] != s.phase):
                phases.append(s.phase)
            if on_status:
                on_status(s)
            statuses.add(self.cluster().status)
            cur = self.ops.GetOperation(O.GetOperationRequest(id=op.id), timeout=10)
            if cur.done:  # the record's last word may have come after the read above
                s = self.status()
                if s.operation_id == op.id and (not phases or phases[-1] != s.phase):
                    phases.append(s.phase)
                return phases, statuses, cur
            time.sleep(0.1)
        self.fail("upgrade %s still running: %s" % (op.id, self.status()))

    def versions(self):
        return {n: self.node(n).annotations["pivirt.io/version"] for n in NODES}

    def test_a_rolling(self):
        op = self.upgrade("v1.1.0", type=C.UPGRADE_TYPE_ROLLING, max_surge=1, max_unavailable=2)
        self.assertEqual((op.kind, op.target), ("cluster.upgrade", self.cluster().id))
        phases, statuses, end = self.follow(op)
        self.assertEqual(end.status, O.OPERATION_STATUS_SUCCEEDED, end)
        self.assertIn(C.UPGRADE_PHASE_UPGRADING, phases)
        self.assertEqual(phases[-1], C.UPGRADE_PHASE_SUCCEEDED)
        self.assertIn(C.CLUSTER_STATUS_UPGRADING, statuses)
        s = self.status()
        self.assertEqual((s.from_version, s.to_version, s.downgrade), ("v1.0.0", "v1.1.0", False))
        self.assertEqual((s.nodes_total, s.nodes_upgraded), (4, 4))
        self.assertEqual([(n.node_name, n.state, n.batch, n.version) for n in s.nodes],
                         [(n, C.NODE_UPGRADE_STATE_UPGRADED, b, "v1.1.0")
                          for n, b in zip(NODES, (1, 1, 2, 2))])
        self.assertTrue(all(n.finished_at.seconds > 0 for n in s.nodes))
        self.assertGreater(s.finished_at.seconds, 0)
        self.assertEqual(s.strategy.max_unavailable, 2)
        c = self.cluster()
        self.assertEqual((c.version, c.status), ("v1.1.0", C.CLUSTER_STATUS_RUNNING))
        self.assertEqual(set(self.versions().values()), {"v1.1.0"})
        self.assertTrue(all(self.node(n).status == C.NODE_STATUS_READY for n in NODES))
        self.assertEqual(len(self.app()), 2)

    def test_b_canary_with_partition(self):
        op = self.upgrade("v1.2.0", type=C.UPGRADE_TYPE_CANARY, max_surge=1, partition=1)
        phases, _, end = self.follow(op)
        self.assertEqual(end.status, O.OPERATION_STATUS_SUCCEEDED, end)
        self.assertIn(C.UPGRADE_PHASE_VERIFYING, phases)
        s = self.status()
        self.assertEqual([(n.node_name, n.state, n.batch) for n in s.nodes],
                         [("u1", C.NODE_UPGRADE_STATE_SKIPPED, 0),
                          ("u2", C.NODE_UPGRADE_STATE_UPGRADED, 1),
                          ("u3", C.NODE_UPGRADE_STATE_UPGRADED, 2),
                          ("u4", C.NODE_UPGRADE_STATE_UPGRADED, 3)])
        self.assertEqual((s.nodes_total, s.nodes_upgraded), (3, 3))
        self.assertEqual(self.versions(), {"u1": "v1.1.0", "u2": "v1.2.0", "u3": "v1.2.0",
                                           "u4": "v1.2.0"})
        self.assertEqual(self.cluster().version, "v1.2.0")

    def test_c_blue_green(self):
        op = self.upgrade("v1.3.0", type=C.UPGRADE_TYPE_BLUE_GREEN, max_surge=1)
        phases, _, end = self.follow(op)
        self.assertEqual(end.status, O.OPERATION_STATUS_SUCCEEDED, end)
        for p in (C.UPGRADE_PHASE_UPGRADING, C.UPGRADE_PHASE_VERIFYING,
                  C.UPGRADE_PHASE_MIGRATING):
            self.assertIn(p, phases)
        self.assertLess(phases.index(C.UPGRADE_PHASE_VERIFYING),
                        phases.index(C.UPGRADE_PHASE_MIGRATING))
        self.assertEqual([n.batch for n in self.status().nodes], [1, 1, 2, 2])
        self.assertEqual(set(self.versions().values()), {"v1.3.0"})
        # every workload moved onto the first (upgraded, verified) half
        app = self.app()
        self.assertEqual(len(app), 2)
        self.assertTrue(set(app) <= {"u1", "u2"}, app)

    def test_d_failure_rolls_back(self):
        marker = os.path.join(_hooks.name, "fail-u3-v1.4.0")
        open(marker, "w").close()
        try:
            op = self.upgrade("v1.4.0", type=C.UPGRADE_TYPE_ROLLING, max_surge=1)
            phases, _, end = self.follow(op)
        finally:
            os.unlink(marker)
        self.assertEqual(end.status, O.OPERATION_STATUS_FAILED, end)
        self.assertIn("node u3", end.error.message)
        self.assertIn("disk full on u3", end.error.message)
        self.assertIn("rolled back to v1.3.0", end.error.message)
        self.assertEqual(end.attempts, 1)
        self.assertIn(C.UPGRADE_PHASE_ROLLING_BACK, phases)
        s = self.status()
        self.assertEqual(s.phase, C.UPGRADE_PHASE_ROLLED_BACK)
        self.assertEqual([(n.node_name, n.state) for n in s.nodes],
                         [("u1", C.NODE_UPGRADE_STATE_ROLLED_BACK),
                          ("u2", C.NODE_UPGRADE_STATE_ROLLED_BACK),
                          ("u3", C.NODE_UPGRADE_STATE_ROLLED_BACK),
                          ("u4", C.NODE_UPGRADE_STATE_PENDING)])
        self.assertEqual(set(self.versions().values()), {"v1.3.0"})
        self.assertTrue(all(self.node(n).status == C.NODE_STATUS_READY for n in NODES))
        c = self.cluster()
        self.assertEqual((c.version, c.status), ("v1.3.0", C.CLUSTER_STATUS_RUNNING))

    def test_e_cancel_rolls_back(self):
        slow = os.path.join(_hooks.name, "slow")
        open(slow, "w").close()
        try:
            op = self.upgrade("v1.5.0", type=C.UPGRADE_TYPE_ROLLING, max_surge=1)
            cancelled = []

            def cancel_once(s):
                if not cancelled and any(n.state == C.NODE_UPGRADE_STATE_UPGRADED
                                         for n in s.nodes):
                    self.ops.CancelOperation(O.CancelOperationRequest(id=op.id), timeout=10)
                    cancelled.append(True)
            _, _, end = self.follow(op, on_status=cancel_once)
        finally:
            os.unlink(slow)
        self.assertEqual(end.status, O.OPERATION_STATUS_CANCELLED, end)
        s = self.status()
        self.assertEqual(s.phase, C.UPGRADE_PHASE_CANCELLED)
        self.assertIn(C.NODE_UPGRADE_STATE_ROLLED_BACK, [n.state for n in s.nodes])
        self.assertEqual(set(self.versions().values()), {"v1.3.0"})
        self.assertTrue(all(self.node(n).status == C.NODE_STATUS_READY for n in NODES))
        self.assertEqual(self.cluster().version, "v1.3.0")

    def test_ez_failed_rollback_leaves_error(self):
        markers = [os.path.join(_hooks.name, "fail-u1-" + v) for v in ("v1.6.0", "v1.3.0")]
        for m in markers:
            open(m, "w").close()
        try:
            op = self.upgrade("v1.6.0", type=C.UPGRADE_TYPE_ROLLING, max_surge=1)
            _, _, end = self.follow(op)
        finally:
            for m in markers:
                os.unlink(m)
        self.assertEqual(end.status, O.OPERATION_STATUS_FAILED, end)
        self.assertIn("the cluster is in ERROR", end.error.message)
        s = self.status()
        self.assertEqual(s.phase, C.UPGRADE_PHASE_FAILED)
        self.assertEqual(s.nodes[0].state, C.NODE_UPGRADE_STATE_FAILED)
        self.assertIn("rollback to v1.3.0 failed", s.nodes[0].message)
        self.assertEqual(self.cluster().status, C.CLUSTER_STATUS_ERROR)
        self.assertEqual(self.node("u1").status, C.NODE_STATUS_ERROR)
        # the operator repairs the node, uncordons it and upgrades again: ERROR is over
        self.cs.UncordonNode(C.UncordonNodeRequest(cluster_id="upg", node_id="u1"), timeout=10)
        op = self.upgrade("v1.6.0", type=C.UPGRADE_TYPE_ROLLING, max_surge=1, max_unavailable=4)
        _, _, end = self.follow(op)
        self.assertEqual(end.status, O.OPERATION_STATUS_SUCCEEDED, end)
        c = self.cluster()
        self.assertEqual((c.version, c.status), ("v1.6.0", C.CLUSTER_STATUS_RUNNING))
        self.assertEqual(self.node("u1").status, C.NODE_STATUS_READY)

    def test_f_bad_requests(self):
        for req, code, part in (
                (C.UpgradeClusterRequest(cluster_id="upg", target_version="v1.6.0"),
                 grpc.StatusCode.FAILED_PRECONDITION, "already runs v1.6.0"),
                (C.UpgradeClusterRequest(cluster_id="upg", target_version="1.4"),
                 grpc.StatusCode.INVALID_ARGUMENT, "target_version: "),
                (C.UpgradeClusterRequest(cluster_id="upg", target_version="v2.0.0",
                                         strategy=C.UpgradeStrategy(max_surge=-1)),
                 grpc.StatusCode.INVALID_ARGUMENT, "strategy.max_surge: -1 is negative"),
                (C.UpgradeClusterRequest(cluster_id="upg", target_version="v2.0.0",
                                         strategy=C.UpgradeStrategy(partition=4)),
                 grpc.StatusCode.FAILED_PRECONDITION, "no node to upgrade"),
                (C.UpgradeClusterRequest(cluster_id="nope", target_version="v2.0.0"),
                 grpc.StatusCode.NOT_FOUND, "cluster nope not found")):
            got, msg = self.err(self.cs.UpgradeCluster, req)
            self.assertEqual(got, code, msg)
            self.assertIn(part, msg)
        self.cs.CreateCluster(C.CreateClusterRequest(name="fresh", version="v1.0.0"), timeout=10)
        got, msg = self.err(self.cs.GetUpgradeStatus,
                            C.GetUpgradeStatusRequest(cluster_id="fresh"))
        self.assertEqual(got, grpc.StatusCode.NOT_FOUND)
        self.assertIn("never been upgraded", msg)

    def test_fz_max_surge_zero_loses_nothing(self):
        """max_surge 0: each workload stops before its replacement is placed, and its record
        goes only once the replacement runs. (The old one used to be removed first, and its
        recorded deploy with it: the placement then found nothing to move, and a ROLLING
        upgrade with max_surge 0 ended SUCCEEDED with every moved workload gone.)"""
        before = {w.id for w in self.core.ListWorkloads(
            core_pb2.ListWorkloadsOptions(appname="svc"), timeout=10)}
        self.assertTrue(before)
        op = self.upgrade("v1.7.0", type=C.UPGRADE_TYPE_ROLLING, max_surge=0, max_unavailable=1)
        _, _, end = self.follow(op, timeout=180)
        self.assertEqual(end.status, O.OPERATION_STATUS_SUCCEEDED, end)
        after = [w.id for w in self.core.ListWorkloads(
            core_pb2.ListWorkloadsOptions(appname="svc"), timeout=10)]
        self.assertEqual(len(after), len(before), after)
        self.assertFalse(before & set(after))  # every node was drained: each one moved

        def all_running():
            try:
                return all(s.running for s in self.core.GetWorkloadsStatus(
                    core_pb2.WorkloadIDs(IDs=after), timeout=10).status)
            except grpc.RpcError:  # a status not reported yet
                return False
        self.assertTrue(self.wait(all_running), after)
        self.assertEqual(set(self.versions().values()), {"v1.7.0"})

    def test_g_seed_example_through_reflection(self):
        made = self.cs.CreateCluster(C.CreateClusterRequest(name="cluster-abc123",
                                                            version="v0.0.89"), timeout=10)
        self.cs.AddNode(C.AddNodeRequest(cluster_id="cluster-abc123", name="node-01",
                                         ip="10.4.0.1", role=C.NODE_ROLE_WORKER), timeout=10)
        self.assertTrue(self.wait(lambda: self.node("node-01", "cluster-abc123").status ==
                                  C.NODE_STATUS_READY))
        # complete for the first time: the schedulers record it without anyone reading it
        key = self.stack.prefix + "{reg}:pod:" + made.id
        self.assertTrue(self.wait(lambda: self.stack.redis.cmd("HGET", key, "formed_ms")))
        # a workload on the only node: it cannot go elsewhere, so it stays through upgrades
        opts = core_pb2.DeployOptions(
            name="solo", entrypoint=core_pb2.EntrypointOptions(name="web",
                                                              commands=["/bin/sh", "run.sh"]),
            podname="cluster-abc123", image="up:1", count=1,
            resources={"cpumem": json.dumps({"memory-request": "16M"}).encode()})
        solo = list(self.core.CreateWorkload(opts, timeout=60))
        self.assertTrue(solo[0].success, solo)
        body = json.dumps({"cluster_id": "cluster-abc123", "target_version": "v0.0.90",
                           "strategy": {"type": "UPGRADE_TYPE_ROLLING", "max_surge": 1,
                                        "max_unavailable": 0}})
        url = "http://%s/pivirt.cluster.v1.ClusterService/UpgradeCluster" % \
            self.stack.gateways[0].addrs[0]
        rc, out, err = pvtest.buf_curl("--protocol", "grpc", "--http2-prior-knowledge", "-d",
                                       body, url, check=False)
        self.assertEqual(rc, 0, err)
        op = json.loads(out)
        self.assertEqual(op["kind"], "cluster.upgrade")
        end = self.ops.WaitOperation(O.WaitOperationRequest(id=op["id"], timeout_seconds=60),
                                     timeout=65)
        self.assertEqual(end.status, O.OPERATION_STATUS_SUCCEEDED, end)
        s = self.status("cluster-abc123")
        self.assertEqual((s.phase, s.nodes_total, s.nodes_upgraded),
                         (C.UPGRADE_PHASE_SUCCEEDED, 1, 1))
        self.assertEqual(self.cluster("cluster-abc123").version, "v0.0.90")
        # max_surge 0 stops a workload before placing its replacement: one that cannot be
        # placed elsewhere is not stopped at all
        op = self.cs.UpgradeCluster(C.UpgradeClusterRequest(
            cluster_id="cluster-abc123", target_version="v0.0.91",
            strategy=C.UpgradeStrategy(type=C.UPGRADE_TYPE_ROLLING, max_surge=0)), timeout=10)
        end = self.ops.WaitOperation(O.WaitOperationRequest(id=op.id, timeout_seconds=60),
                                     timeout=65)
        self.assertEqual(end.status, O.OPERATION_STATUS_SUCCEEDED, end)
        left = [w.id for w in self.core.ListWorkloads(
            core_pb2.ListWorkloadsOptions(appname="solo"), timeout=10)]
        self.assertEqual(left, [solo[0].id])
        list(self.core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(IDs=left, force=True),
                                      timeout=60))


if __name__ == "__main__":
    unittest.main(verbosity=2)
