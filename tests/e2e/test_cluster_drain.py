#!/usr/bin/python3
"""End-to-end tests of ClusterService's DrainNode, RemoveNode and DeleteCluster with live node
agents running real processes.

Three agents (dn1, dn2, dn3) wait for AddNode into cluster "drn"; workloads are deployed into it
with CoreRPC's CreateWorkload (the cluster is the pod). The image's program ignores SIGTERM, so
every stop takes the drain's grace period and ends with SIGKILL: long enough to see the node
DRAINING. Stops that name no grace (RemoveNode, DeleteCluster) take worker.stop_grace_seconds,
1 s here.

  test_0  the agents' machine figures and pressure conditions (disk pressure from 1 % here),
          and the health they make (DEGRADED, naming the pressure).
  test_a  a workload pinned by node labels to dn1 cannot be placed elsewhere: the drain fails
          RESOURCE_EXHAUSTED naming it and leaves dn1 cordoned; with force it is removed.
  test_b  a daemon workload (label pivirt.io/daemon=true) refuses the drain at the call,
          FAILED_PRECONDITION naming it, nothing cordoned; with ignore_daemonsets the drain
          moves both instances of the app: DRAINING while it runs, CORDONED at the end, the app
          still has two instances, now on dn2/dn3 and running, the old processes gone (after
          SIGKILL) and their records removed; the daemon stays on dn1; progress names the moves.
  test_c  CancelOperation stops a drain midway: CANCELLED, the node stays cordoned.
  test_c2 the ops worker running a drain is SIGKILLed after its first move: the other worker
          takes it over after the lease and finishes it; exactly the app's instances remain.
  test_d  RemoveNode moves the node's workloads off and deletes its record (both APIs stop
          seeing it); a daemon goes with its node.
  test_e  DeleteCluster refuses while workloads would be lost (naming them); forced, it stops
          them, removes every node and the cluster.
  test_f  the seed's AddNode and DrainNode examples, as written, through buf curl and
          reflection.
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
NODES = ("dn1", "dn2", "dn3")
_stack = None


def setUpModule():
    global _stack
    _stack = pvtest.Stack(gateways=1, workers=2, schedulers=1,
                          agents=[(n, "") for n in NODES],
                          config={"worker": {"heartbeat_seconds": 1, "lease_ms": 2000,
                                             "status_interval_seconds": 1,
                                             "stop_grace_seconds": 1,
                                             "disk_pressure_percent": 1,
                                             "memory_pressure_percent": 100}})
    _stack.start()
    make_image(os.path.join(_stack.data_dir, "images", "stub", "1.tar"))


def tearDownModule():
    _stack.stop()


def make_image(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tempfile.TemporaryDirectory() as root:
        script = os.path.join(root, "run.sh")
        with open(script, "w") as f:
            # deaf to SIGTERM: a stop waits out the grace, then SIGKILL
            f.write("#!/bin/sh\ntrap '' TERM\nwhile :; do sleep 1; done\n")
        os.chmod(script, 0o755)
        with tarfile.open(path, "w") as t:
            t.add(script, arcname="run.sh")


def pid_alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


class Drain(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stack = _stack
        ch = cls.stack.channel(0)
        cls.cs = cluster_pb2_grpc.ClusterServiceStub(ch)
        cls.core = core_pb2_grpc.CoreRPCStub(ch)
        cls.ops = operations_pb2_grpc.OperationServiceStub(ch)
        cls.cs.CreateCluster(C.CreateClusterRequest(name="drn", version="v1.0.0"), timeout=10)
        for i, n in enumerate(NODES):
            cls.cs.AddNode(C.AddNodeRequest(cluster_id="drn", name=n, ip="10.1.0.%d" % (i + 1),
                                            role=C.NODE_ROLE_WORKER,
                                            labels={"zone": "a" if n == "dn1" else "b"}),
                           timeout=10)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if all(cls.node(n).status == C.NODE_STATUS_READY and
                   cls.node(n).resources.memory_bytes > 0 for n in NODES):
                break
            time.sleep(0.2)

    @classmethod
    def node(cls, name):
        return cls.cs.GetNode(C.GetNodeRequest(cluster_id="drn", node_id=name), timeout=10)

    def err(self, fn, req):
        with self.assertRaises(grpc.RpcError) as e:
            fn(req, timeout=10)
        return e.exception.code(), e.exception.details()

    def wait_op(self, op_id, timeout=60):
        return self.ops.WaitOperation(O.WaitOperationRequest(id=op_id, timeout_seconds=timeout),
                                      timeout=timeout + 5)

    def deploy(self, name, count, nodes=(), labels=None, nodelabels=None):
        opts = core_pb2.DeployOptions(
            name=name, entrypoint=core_pb2.EntrypointOptions(name="web",
                                                             commands=["/bin/sh", "run.sh"]),
            podname="drn", image="stub:1", count=count, nodenames=list(nodes),
            labels=labels or {}, nodelabels=nodelabels or {},
            resources={"cpumem": json.dumps({"memory-request": "32M"}).encode()})
        msgs = list(self.core.CreateWorkload(opts, timeout=60))
        self.assertTrue(all(m.success for m in msgs), msgs)
        return msgs

    def app(self, name):
        return {w.id: w.nodename for w in self.core.ListWorkloads(
            core_pb2.ListWorkloadsOptions(appname=name), timeout=10)}

    def pid_of(self, node, wid):
        with open(os.path.join(self.stack.data_dir, "engine", node, wid, "record.json")) as f:
            rec = json.load(f)
        return rec.get("pid") or rec.get("main_pid")

    def uncordon(self, name):
        op = self.cs.UncordonNode(C.UncordonNodeRequest(cluster_id="drn", node_id=name),
                                  timeout=10)
        self.assertTrue(op.done)

    def test_0_conditions_and_machine_figures(self):
        # worker.disk_pressure_percent 1: any disk in use presses; memory never reaches 100%
        n = self.node("dn2")
        self.assertEqual((n.conditions.disk_pressure, n.conditions.memory_pressure,
                          n.conditions.pid_pressure), (True, False, False))
        self.assertGreater(n.resources.storage_used_bytes, 0)
        self.assertGreater(n.resources.memory_used_bytes, 0)
        self.assertLess(n.resources.memory_used_bytes, n.resources.memory_bytes)
        h = self.cs.GetHealth(C.GetHealthRequest(cluster_id="drn"), timeout=10)
        self.assertEqual(h.status, C.HEALTH_STATUS_DEGRADED)
        self.assertEqual(h.message, "3 of its 3 nodes are under pressure")
        self.assertTrue(all(x.status == C.HEALTH_STATUS_DEGRADED and
                            "disk pressure" in x.message for x in h.nodes), h.nodes)

    def test_a_unplaceable_workload(self):
        msgs = self.deploy("pinned", 1, nodelabels={"zone": "a"})
        self.assertEqual(msgs[0].nodename, "dn1")
        op = self.cs.DrainNode(C.DrainNodeRequest(cluster_id="drn", node_id="dn1",
                                                  grace_period_seconds=0), timeout=10)
        self.assertEqual((op.kind, op.target), ("node.drain", self.node("dn1").id))
        done = self.wait_op(op.id)
        self.assertEqual(done.status, O.OPERATION_STATUS_FAILED, done)
        self.assertEqual(done.error.code, grpc.StatusCode.RESOURCE_EXHAUSTED.value[0])
        self.assertIn("workload %s" % msgs[0].name, done.error.message)
        self.assertIn("cannot be placed elsewhere", done.error.message)
        self.assertEqual(done.attempts, 1)  # its answer, not a fault to retry
        self.assertEqual(self.node("dn1").status, C.NODE_STATUS_CORDONED)
        self.assertEqual(self.app("pinned"), {msgs[0].id: "dn1"})  # nothing lost
        # force removes what cannot go elsewhere
        op = self.cs.DrainNode(C.DrainNodeRequest(cluster_id="drn", node_id="dn1", force=True,
                                                  grace_period_seconds=0), timeout=10)
        done = self.wait_op(op.id)
        self.assertEqual(done.status, O.OPERATION_STATUS_SUCCEEDED, done)
        self.assertIn("0 workload(s) moved, 1 removed", done.message)
        self.assertEqual(self.app("pinned"), {})
        self.uncordon("dn1")

    def test_b_drain_moves_workloads(self):
        web = self.deploy("web", 2, nodes=("dn1",))
        daemon = self.deploy("agentd", 1, nodes=("dn1",), labels={"pivirt.io/daemon": "true"})
        old = {m.id: self.pid_of("dn1", m.id) for m in web}
        # a daemon refuses the drain at the call; nothing is cordoned
        code, msg = self.err(self.cs.DrainNode, C.DrainNodeRequest(cluster_id="drn",
                                                                   node_id="dn1"))
        self.assertEqual(code, grpc.StatusCode.FAILED_PRECONDITION, msg)
        self.assertIn(daemon[0].name, msg)
        self.assertIn("ignore_daemonsets", msg)
        self.assertEqual(self.node("dn1").status, C.NODE_STATUS_READY)
        code, msg = self.err(self.cs.DrainNode, C.DrainNodeRequest(
            cluster_id="drn", node_id="dn1", grace_period_seconds=-1))
        self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("grace_period_seconds: -1 is negative", msg)
        # ignore_daemonsets: the others move, one at a time, replacement first
        op = self.cs.DrainNode(C.DrainNodeRequest(cluster_id="drn", node_id="dn1",
                                                  ignore_daemonsets=True,
                                                  grace_period_seconds=1), timeout=10)
        seen, counts = set(), set()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            seen.add(self.node("dn1").status)
            counts.add(len(self.app("web")))
            cur = self.ops.GetOperation(O.GetOperationRequest(id=op.id), timeout=10)
            if cur.done:
                break
            time.sleep(0.05)
        self.assertEqual(cur.status, O.OPERATION_STATUS_SUCCEEDED, cur)
        self.assertIn(C.NODE_STATUS_DRAINING, seen)
        self.assertTrue(min(counts) >= 2, counts)  # never fewer instances than before
        self.assertIn("2 workload(s) moved, 0 removed, 1 daemon(s) left", cur.message)
        self.assertEqual(self.node("dn1").status, C.NODE_STATUS_CORDONED)
        now = self.app("web")
        self.assertEqual(len(now), 2)
        self.assertFalse(set(now) & set(old))
        self.assertTrue(set(now.values()) <= {"dn2", "dn3"}, now)
        for wid, node in now.items():
            self.assertTrue(pid_alive(self.pid_of(node, wid)))
        for wid, pid in old.items():
            self.assertFalse(pid_alive(pid), wid)  # SIGKILLed after the grace
            code, _ = self.err(self.core.GetWorkload, core_pb2.WorkloadID(id=wid))
            self.assertNotEqual(code, grpc.StatusCode.OK)
        self.assertEqual(self.app("agentd"), {daemon[0].id: "dn1"})
        # its replacements were deploys of their own, listed as operations
        deploys = [d for d in self.ops.ListOperations(
            O.ListOperationsRequest(kind="workload.create"), timeout=10)
            if d.request_id.startswith(op.id + "/place/")]
        self.assertEqual(sorted(d.request_id.rsplit("/", 1)[1] for d in deploys), sorted(old))
        self.assertTrue(all(d.status == O.OPERATION_STATUS_SUCCEEDED for d in deploys))

    def test_c_cancel_leaves_node_cordoned(self):
        self.uncordon("dn2")
        msgs = self.deploy("slow", 3, nodes=("dn2",))
        op = self.cs.DrainNode(C.DrainNodeRequest(cluster_id="drn", node_id="dn2",
                                                  grace_period_seconds=2), timeout=10)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            cur = self.ops.GetOperation(O.GetOperationRequest(id=op.id), timeout=10)
            if "moving" in cur.message or cur.done:
                break
            time.sleep(0.05)
        self.ops.CancelOperation(O.CancelOperationRequest(id=op.id), timeout=10)
        done = self.wait_op(op.id)
        self.assertEqual(done.status, O.OPERATION_STATUS_CANCELLED, done)
        self.assertEqual(self.node("dn2").status, C.NODE_STATUS_CORDONED)
        left = self.app("slow")
        self.assertGreaterEqual(len(left), 3)  # nothing lost
        self.assertTrue(any(n == "dn2" for n in left.values()), left)  # not all moved
        self.uncordon("dn2")

    def drain_past_first_move(self, node):
        """Starts draining node and returns (its operation, the record once the first workload
        has moved, the drain still running)."""
        op = self.cs.DrainNode(C.DrainNodeRequest(cluster_id="drn", node_id=node,
                                                  grace_period_seconds=1), timeout=10)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            cur = self.ops.GetOperation(O.GetOperationRequest(id=op.id), timeout=10)
            if "(2 of " in cur.message or cur.done:  # the first one has moved
                break
            time.sleep(0.05)
        self.assertFalse(cur.done, "%s %s %s" % (cur.status, cur.message, cur.error.message))
        return op, cur

    def test_c2_worker_killed_mid_drain(self):
        # the ops worker running a drain dies (SIGKILL) after its first move: the other worker
        # takes the operation over when the lease runs out and finishes it from its journal,
        # without moving a workload twice or losing one
        self.uncordon("dn2")
        self.uncordon("dn3")
        msgs = self.deploy("chaos", 3, nodes=("dn2",))
        op, cur = self.drain_past_first_move("dn2")
        victim = [w for w in self.stack.workers if cur.worker.endswith("-%d" % w.pid)]
        self.assertEqual(len(victim), 1, (cur.worker, [w.pid for w in self.stack.workers]))
        victim[0].kill9()
        done = self.wait_op(op.id, timeout=90)
        self.assertEqual(done.status, O.OPERATION_STATUS_SUCCEEDED, done)
        self.assertNotEqual(done.worker, cur.worker)  # finished by the other worker
        self.assertGreaterEqual(done.attempts, 2)
        now = self.app("chaos")
        self.assertEqual(len(now), 3, now)  # no instance lost, none made twice
        self.assertEqual(len(self.app("web")), 2)
        self.assertNotIn("dn2", now.values())
        self.assertFalse(set(now) & {m.id for m in msgs})
        victim[0].start()
        self.uncordon("dn2")
        # the audit of the whole state finds nothing the kill left behind
        self.assertEqual(self.stack.check(), [])

    def test_c3_agent_killed_mid_drain(self):
        # the node agent of the drained node dies (SIGKILL) after the first move and comes
        # back a second later: the drain waits for it, adopts what it left, and ends with every
        # instance moved once, none lost, nothing left reserved or running on the node
        self.uncordon("dn2")
        self.uncordon("dn3")
        msgs = self.deploy("agentkill", 3, nodes=("dn2",))
        op, cur = self.drain_past_first_move("dn2")
        agent = [a for a in self.stack.agents if a.name == "agent-dn2"]
        self.assertEqual(len(agent), 1, [a.name for a in self.stack.agents])
        agent[0].kill9()
        time.sleep(1)
        agent[0].start()
        self.stack.wait_ready(agent)
        done = self.wait_op(op.id, timeout=120)
        self.assertEqual(done.status, O.OPERATION_STATUS_SUCCEEDED, done)
        now = self.app("agentkill")
        self.assertEqual(len(now), 3, now)
        self.assertNotIn("dn2", now.values())
        self.assertFalse(set(now) & {m.id for m in msgs})
        for m in msgs:  # the old instances' processes are gone with them
            self.assertFalse(os.path.exists(os.path.join(self.stack.data_dir, "engine", "dn2",
                                                         m.id)), m.id)
        self.uncordon("dn2")
        self.assertEqual(self.stack.check(), [])

    def test_d_remove_node(self):
        on3 = [w for w, n in self.app("web").items() if n == "dn3"]
        op = self.cs.RemoveNode(C.RemoveNodeRequest(cluster_id="drn", node_id="dn3"),
                                timeout=10)
        self.assertEqual(op.kind, "node.remove")
        done = self.wait_op(op.id)
        self.assertEqual(done.status, O.OPERATION_STATUS_SUCCEEDED, done)
        code, _ = self.err(self.cs.GetNode, C.GetNodeRequest(cluster_id="drn", node_id="dn3"))
        self.assertEqual(code, grpc.StatusCode.NOT_FOUND)
        self.assertNotIn("dn3", [n.name for n in self.core.ListPodNodes(
            core_pb2.ListNodesOptions(podname="drn", all=True), timeout=10)])
        web = self.app("web")
        self.assertEqual(len(web), 2)
        self.assertNotIn("dn3", web.values())
        self.assertFalse(set(on3) & set(web))
        # a daemon goes with its node (dn1 is cordoned: its web moved already)
        op = self.cs.RemoveNode(C.RemoveNodeRequest(cluster_id="drn", node_id="dn1"),
                                timeout=10)
        done = self.wait_op(op.id)
        self.assertEqual(done.status, O.OPERATION_STATUS_SUCCEEDED, done)
        self.assertEqual(self.app("agentd"), {})
        self.assertEqual(self.stack.check(), [])

    def test_e_delete_cluster(self):
        code, msg = self.err(self.cs.DeleteCluster, C.DeleteClusterRequest(cluster_id="drn"))
        self.assertEqual(code, grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("would be lost", msg)
        self.assertIn("web_", msg)
        op = self.cs.DeleteCluster(C.DeleteClusterRequest(cluster_id="drn", force=True),
                                   timeout=10)
        self.assertEqual(op.kind, "cluster.delete")
        done = self.wait_op(op.id)
        self.assertEqual(done.status, O.OPERATION_STATUS_SUCCEEDED, done)
        code, _ = self.err(self.cs.GetCluster, C.GetClusterRequest(cluster_id="drn"))
        self.assertEqual(code, grpc.StatusCode.NOT_FOUND)
        self.assertEqual(self.app("web"), {})
        self.assertNotIn("drn", [p.name for p in self.core.ListPods(core_pb2.Empty(),
                                                                     timeout=10).pods])
        self.assertEqual(self.stack.check(), [])

    def test_f_seed_example_through_reflection(self):
        # the seed's DrainNode example as written, with buf curl (grpcurl's way: reflection)
        self.cs.CreateCluster(C.CreateClusterRequest(name="cluster-abc123", version="v1.0.0"),
                              timeout=10)
        self.cs.AddNode(C.AddNodeRequest(cluster_id="cluster-abc123", name="node-01",
                                         ip="10.2.0.1", role=C.NODE_ROLE_WORKER), timeout=10)
        base = "http://%s/pivirt.cluster.v1.ClusterService/" % self.stack.gateways[0].addrs[0]
        # the seed's AddNode example: a node without an agent yet is NOT_READY
        body = json.dumps({"cluster_id": "cluster-abc123", "name": "worker-04",
                           "role": "NODE_ROLE_WORKER", "ip": "10.0.1.24"})
        rc, out, err = pvtest.buf_curl("--protocol", "grpc", "--http2-prior-knowledge", "-d",
                                       body, base + "AddNode", check=False)
        self.assertEqual(rc, 0, err)
        added = json.loads(out)
        self.assertEqual((added["name"], added["role"], added["ip"], added["status"]),
                         ("worker-04", "NODE_ROLE_WORKER", "10.0.1.24", "NODE_STATUS_NOT_READY"))
        body = json.dumps({"cluster_id": "cluster-abc123", "node_id": "node-01",
                           "force": False, "grace_period_seconds": 300})
        rc, out, err = pvtest.buf_curl("--protocol", "grpc", "--http2-prior-knowledge", "-d",
                                       body, base + "DrainNode", check=False)
        self.assertEqual(rc, 0, err)
        got = json.loads(out)
        self.assertEqual(got["kind"], "node.drain")
        done = self.wait_op(got["id"])
        self.assertEqual(done.status, O.OPERATION_STATUS_SUCCEEDED, done)
        self.assertIn("0 workload(s) moved", done.message)
        n = self.cs.GetNode(C.GetNodeRequest(cluster_id="cluster-abc123", node_id="node-01"),
                            timeout=10)
        self.assertEqual(n.status, C.NODE_STATUS_CORDONED)


if __name__ == "__main__":
    unittest.main(verbosity=2)
