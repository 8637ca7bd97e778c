#!/usr/bin/python3
"""End-to-end tests of pivirt.cluster.v1.ClusterService's clusters and nodes through a real gRPC
client: CreateCluster, GetCluster, ListClusters, UpdateCluster, AddNode, GetNode, ListNodes,
CordonNode and UncordonNode (Operations run by an ops worker), GetHealth and GetMetrics, on the
one registry CoreRPC reads too.

Two node agents run with no pod of their own (worker.pod ""): they register nothing and wait for
AddNode, then heartbeat (READY) and fill in the node's resources from their machine. A cluster
asking for one control-plane and one worker node is CREATING until both are READY, RUNNING
then, DEGRADED when an agent stops. Cordon is Eru's bypass (CoreRPC's GetNode shows it).
Errors use the standard codes and name the field. Drains, removals and deletion are in
test_cluster_drain, upgrades in test_cluster_upgrade.
"""
import os
import sys
import time
import unittest

import grpc

import pvtest
from pb import core_pb2, core_pb2_grpc
from pivirt.cluster.v1 import cluster_pb2, cluster_pb2_grpc

C = cluster_pb2
_stack = None


def setUpModule():
    global _stack
    _stack = pvtest.Stack(gateways=1, workers=1, schedulers=1, agents=[("cn1", ""), ("wn1", "")],
                          config={"worker": {"heartbeat_seconds": 1,
                                             # the health below must not depend on how full
                                             # this machine is
                                             "memory_pressure_percent": 100,
                                             "disk_pressure_percent": 100,
                                             "pid_pressure_percent": 100}})
    _stack.start()


def tearDownModule():
    _stack.stop()


class Clusters(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stack = _stack
        cls.cs = cluster_pb2_grpc.ClusterServiceStub(cls.stack.channel(0))
        cls.core = core_pb2_grpc.CoreRPCStub(cls.stack.channel(0))

    def err(self, fn, req):
        with self.assertRaises(grpc.RpcError) as e:
            fn(req, timeout=10)
        return e.exception.code(), e.exception.details()

    def wait_for(self, what, fn, timeout=15):
        deadline = time.monotonic() + timeout
        got = fn()
        while got != what and time.monotonic() < deadline:
            time.sleep(0.2)
            got = fn()
        self.assertEqual(got, what)

    def test_a_clusters(self):
        c = self.cs.CreateCluster(C.CreateClusterRequest(
            name="blue", version="v1.2.3", labels={"env": "prod"},
            topology=C.ClusterTopology(control_plane_count=0, worker_count=2)), timeout=10)
        self.assertTrue(c.id.startswith("cluster-"))
        self.assertEqual((c.name, c.version, c.status), ("blue", "v1.2.3",
                                                         C.CLUSTER_STATUS_CREATING))
        self.assertEqual(c.topology.worker_count, 2)
        self.assertGreater(c.created_at.seconds, 0)
        self.assertEqual(self.cs.GetCluster(C.GetClusterRequest(cluster_id=c.id),
                                            timeout=10).name, "blue")
        self.assertEqual(self.cs.GetCluster(C.GetClusterRequest(cluster_id="blue"),
                                            timeout=10).id, c.id)
        # one registry: CoreRPC sees the cluster as a pod
        self.assertIn("blue", [p.name for p in self.core.ListPods(core_pb2.Empty(),
                                                                   timeout=10).pods])
        self.cs.CreateCluster(C.CreateClusterRequest(name="green", version="v2.0.0",
                                                     labels={"env": "test"}), timeout=10)
        names = [x.name for x in self.cs.ListClusters(C.ListClustersRequest(
            labels={"env": "prod"}), timeout=10)]
        self.assertEqual(names, ["blue"])
        # update: labels replaced, annotations set, topology changed, name immutable
        u = self.cs.UpdateCluster(C.UpdateClusterRequest(
            cluster_id="blue", labels={"env": "staging"}, annotations={"owner": "ops"},
            topology=C.ClusterTopology(worker_count=1)), timeout=10)
        self.assertEqual((dict(u.labels), dict(u.annotations), u.topology.worker_count),
                         ({"env": "staging"}, {"owner": "ops"}, 1))
        u = self.cs.UpdateCluster(C.UpdateClusterRequest(cluster_id=c.id, update_labels=True),
                                  timeout=10)
        self.assertEqual((dict(u.labels), dict(u.annotations)), ({}, {"owner": "ops"}))
        code, msg = self.err(self.cs.UpdateCluster, C.UpdateClusterRequest(cluster_id="blue",
                                                                           name="red"))
        self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("name: a cluster's name is immutable", msg)
        # bad input names the field
        for req, field in ((C.CreateClusterRequest(name="blue", version="v1.0.0"), "name"),
                           (C.CreateClusterRequest(name="x1", version="1.2"), "version"),
                           (C.CreateClusterRequest(name="x2", version="v01.2.3"), "version"),
                           (C.CreateClusterRequest(name="a/b", version="v1.0.0"), "name"),
                           (C.CreateClusterRequest(name="x3", version="v1.0.0",
                                                   topology=C.ClusterTopology(worker_count=-1)),
                            "topology.worker_count")):
            code, msg = self.err(self.cs.CreateCluster, req)
            self.assertIn(code, (grpc.StatusCode.INVALID_ARGUMENT,
                                 grpc.StatusCode.ALREADY_EXISTS), msg)
            self.assertTrue(msg.startswith(field + ":"), msg)
        code, msg = self.err(self.cs.GetCluster, C.GetClusterRequest(cluster_id="nope"))
        self.assertEqual(code, grpc.StatusCode.NOT_FOUND)
        self.assertIn("cluster nope not found", msg)

    def test_b_nodes_readiness_and_cordon(self):
        self.cs.CreateCluster(C.CreateClusterRequest(
            name="prod", version="v0.9.0",
            topology=C.ClusterTopology(control_plane_count=1, worker_count=1)), timeout=10)
        status = lambda: self.cs.GetCluster(C.GetClusterRequest(cluster_id="prod"),
                                            timeout=10).status
        n = self.cs.AddNode(C.AddNodeRequest(cluster_id="prod", name="cn1", ip="10.0.0.1",
                                             role=C.NODE_ROLE_CONTROL_PLANE,
                                             labels={"zone": "a"}), timeout=10)
        self.assertEqual((n.name, n.role, n.ip), ("cn1", C.NODE_ROLE_CONTROL_PLANE, "10.0.0.1"))
        node = lambda name: self.cs.GetNode(C.GetNodeRequest(cluster_id="prod", node_id=name),
                                            timeout=10)
        # its agent (waiting for AddNode) beats: READY, with its machine's resources and version
        self.wait_for(C.NODE_STATUS_READY, lambda: node("cn1").status)
        self.wait_for(True, lambda: node("cn1").resources.cpu_cores > 0)
        got = node(n.id)
        self.assertGreater(got.resources.memory_bytes, 0)
        self.assertTrue(got.annotations["pivirt.io/version"])
        self.assertEqual(status(), C.CLUSTER_STATUS_CREATING)  # no worker yet
        self.cs.AddNode(C.AddNodeRequest(cluster_id="prod", name="wn1", ip="fd00::7",
                                         role=C.NODE_ROLE_WORKER), timeout=10)
        self.wait_for(C.CLUSTER_STATUS_RUNNING, status)
        c = self.cs.GetCluster(C.GetClusterRequest(cluster_id="prod"), timeout=10)
        self.assertEqual(list(c.topology.control_plane_nodes), [n.id])
        self.assertEqual(len(c.topology.worker_nodes), 1)
        # filters
        listed = lambda **kw: [x.name for x in self.cs.ListNodes(C.ListNodesRequest(**kw),
                                                                 timeout=10)]
        self.assertEqual(listed(cluster_id="prod"), ["cn1", "wn1"])
        self.assertEqual(listed(cluster_id="prod", role=C.NODE_ROLE_WORKER), ["wn1"])
        self.assertEqual(listed(labels={"zone": "a"}), ["cn1"])
        # cordon: an Operation (node.cordon) on the ops workers; it is Eru's bypass, and
        # CORDONED shows before readiness
        op = self.cs.CordonNode(C.CordonNodeRequest(cluster_id="prod", node_id="cn1"),
                                timeout=10)
        self.assertEqual((op.kind, op.status, op.done), ("node.cordon", 3, True))
        self.assertEqual(op.target, n.id)
        self.assertEqual(node("cn1").status, C.NODE_STATUS_CORDONED)
        self.assertTrue(self.core.GetNode(core_pb2.GetNodeOptions(nodename="cn1"),
                                          timeout=10).bypass)
        self.assertEqual(listed(status=C.NODE_STATUS_CORDONED), ["cn1"])
        self.assertEqual(status(), C.CLUSTER_STATUS_RUNNING)  # cordoned, still up
        again = self.cs.CordonNode(C.CordonNodeRequest(cluster_id=c.id, node_id=n.id),
                                   timeout=10)  # ids work too; cordoning again changes nothing
        self.assertTrue(again.done)
        op = self.cs.UncordonNode(C.UncordonNodeRequest(cluster_id="prod", node_id="cn1"),
                                  timeout=10)
        self.assertEqual((op.kind, op.done), ("node.uncordon", True))
        self.assertEqual(node("cn1").status, C.NODE_STATUS_READY)
        code, msg = self.err(self.cs.CordonNode, C.CordonNodeRequest(cluster_id="prod",
                                                                     node_id="nope"))
        self.assertEqual(code, grpc.StatusCode.NOT_FOUND)
        self.assertIn("node nope not found", msg)
        # an agent that stops: its node NOT_READY, the cluster DEGRADED
        agent = self.stack.agents[self.stack.agent_nodes.index("wn1")]
        agent.stop()
        self.wait_for(C.NODE_STATUS_NOT_READY, lambda: node("wn1").status)
        self.assertEqual(status(), C.CLUSTER_STATUS_DEGRADED)
        h = self.cs.GetHealth(C.GetHealthRequest(cluster_id="prod"), timeout=10)
        self.assertEqual(h.status, C.HEALTH_STATUS_DEGRADED)
        self.assertEqual(h.message, "1 of its 2 nodes are down: wn1")
        self.assertEqual({x.node_name: (x.status, x.message) for x in h.nodes},
                         {"cn1": (C.HEALTH_STATUS_HEALTHY, "ready"),
                          "wn1": (C.HEALTH_STATUS_UNHEALTHY, "agent heartbeat missing")})
        agent.start()
        self.wait_for(C.CLUSTER_STATUS_RUNNING, status)
        h = self.cs.GetHealth(C.GetHealthRequest(cluster_id="prod"), timeout=10)
        self.assertEqual(h.status, C.HEALTH_STATUS_HEALTHY, h.message)
        kinds = sorted(c.name.split(" ")[0] for c in h.components)
        self.assertEqual(kinds, ["gateway", "redis", "scheduler", "worker"])
        self.assertTrue(all(c.status == C.HEALTH_STATUS_HEALTHY for c in h.components))
        # metrics: nodes by status, their capacity, the operations on the cluster's nodes
        m = self.cs.GetMetrics(C.GetMetricsRequest(cluster_id="prod"), timeout=10)
        self.assertEqual((m.nodes.total, m.nodes.ready, m.nodes.cordoned), (2, 2, 0))
        self.assertGreater(m.cpu_cores, 0)
        self.assertEqual(m.memory_bytes, node("cn1").resources.memory_bytes +
                         node("wn1").resources.memory_bytes)
        self.assertEqual(m.workload_count, 0)
        self.assertEqual((m.operations.succeeded, m.operations.pending), (3, 0))
        self.assertEqual((m.queue_depth, m.oldest_pending_age_seconds), (0, 0))
        self.assertGreater(m.collected_at.seconds, 0)
        h = self.cs.GetHealth(C.GetHealthRequest(cluster_id="green"), timeout=10)
        self.assertEqual((h.status, h.message), (C.HEALTH_STATUS_UNHEALTHY, "it has no nodes"))
        code, msg = self.err(self.cs.GetHealth, C.GetHealthRequest(cluster_id="nope"))
        self.assertEqual(code, grpc.StatusCode.NOT_FOUND)
        # bad input
        for req, code, part in (
                (C.AddNodeRequest(cluster_id="prod", name="x9", ip="10.0.0.300",
                                  role=C.NODE_ROLE_WORKER),
                 grpc.StatusCode.INVALID_ARGUMENT, 'ip: "10.0.0.300" is not an IPv4 or IPv6'),
                (C.AddNodeRequest(cluster_id="prod", name="x9", ip="10.0.0.9"),
                 grpc.StatusCode.INVALID_ARGUMENT, "role: required"),
                (C.AddNodeRequest(cluster_id="prod", name="cn1", ip="10.0.0.9",
                                  role=C.NODE_ROLE_WORKER),
                 grpc.StatusCode.ALREADY_EXISTS, "name: a node named cn1 already exists"),
                (C.AddNodeRequest(cluster_id="nope", name="x9", ip="10.0.0.9",
                                  role=C.NODE_ROLE_WORKER),
                 grpc.StatusCode.NOT_FOUND, "cluster_id: cluster nope not found")):
            got_code, msg = self.err(self.cs.AddNode, req)
            self.assertEqual(got_code, code, msg)
            self.assertIn(part, msg)
        self.cs.CreateCluster(C.CreateClusterRequest(name="other", version="v1.0.0"), timeout=10)
        code, msg = self.err(self.cs.GetNode, C.GetNodeRequest(cluster_id="other",
                                                               node_id="cn1"))
        self.assertEqual(code, grpc.StatusCode.NOT_FOUND)
        self.assertIn("node cn1 is not in cluster other", msg)


if __name__ == "__main__":
    unittest.main(verbosity=2)
