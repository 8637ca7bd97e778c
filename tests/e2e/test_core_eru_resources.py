"""End-to-end tests of the resource documents pb.CoreRPC shows (Node.resource_capacity and
resource_usage, NodeResource) and of how deploys spread over nodes that tie.

Real processes only: redis-server, a pivirt-gateway, a pivirt-scheduler, an ops worker and four
node agents (process engines; pivirt-worker --set worker.node=N with no pod, so each node exists
once AddNode adds it), driven by Debian's python3-grpcio.

Classes:
  Shapes  through a node's life (AddNode, SetNode with a delta, a deploy of two instances, their
          removal) every call that shows a node (AddNode, SetNode, GetNode, ListPodNodes,
          GetNodeResource, GetPodResource) answers Eru's cpumem and storage documents: capacity
          and usage in one shape (cpu a number, cpu_map, memory in bytes, numa_memory, numa;
          volumes, disks, storage), the right numbers each time, zeros when idle; the deploy's
          messages print a cpu-request of 0.1 as 0.1.
  Ties    deploys of one instance over three nodes that tie land on more than one node (Eru's
          strategies break ties in an order that changes from call to call).
"""
import itertools
import json
import time
import unittest

import pvtest
from pb import core_pb2, core_pb2_grpc

_stack = None
_counter = itertools.count(1)
NODES = ("era", "erb", "erc", "erd")  # era: Shapes; the rest: Ties
G = 1 << 30
M = 1 << 20


def setUpModule():
    global _stack
    _stack = pvtest.Stack(workers=1, schedulers=1,
                          agents=[{"node": n, "pod": ""} for n in NODES])
    _stack.start()
    pvtest.write_script_image(_stack.data_dir, "demo", "1", "sleep 60\n")


def tearDownModule():
    _stack.stop()


def wait_for(pred, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


def cpumem(cpu, cpu_map, memory, numa_memory=None, numa=None):
    return {"cpu": cpu, "cpu_map": cpu_map, "memory": memory,
            "numa_memory": numa_memory or {}, "numa": numa or {}}


def storage(volumes, total):
    return {"volumes": volumes, "disks": [], "storage": total}


class Base(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stack = _stack
        cls.core = core_pb2_grpc.CoreRPCStub(cls.stack.channel(0))

    def add_pod(self):
        pod = "erp%d" % next(_counter)
        self.core.AddPod(core_pb2.AddPodOptions(name=pod), timeout=10)
        return pod

    def add_node(self, pod, name, resources):
        n = self.core.AddNode(core_pb2.AddNodeOptions(
            nodename=name, endpoint="process://", podname=pod,
            resources={k: json.dumps(v).encode() for k, v in resources.items()}), timeout=10)
        self.assertTrue(wait_for(lambda: self.core.GetNode(core_pb2.GetNodeOptions(
            nodename=name), timeout=10).available, 30))
        return n

    def deploy(self, pod, count, resources, name=None):
        return core_pb2.DeployOptions(
            name=name or "er%d" % next(_counter),
            entrypoint=core_pb2.EntrypointOptions(name="web", commands=["/bin/sh", "run.sh"]),
            podname=pod, image="demo:1", count=count,
            resources={k: json.dumps(v).encode() for k, v in resources.items()})

    def remove(self, ids):
        got = list(self.core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(IDs=list(ids)),
                                            timeout=60))
        self.assertEqual(sorted((g.id, g.success) for g in got), sorted((i, True) for i in ids))


class Shapes(Base):
    def views(self, pod, node):
        """(capacity, usage) as every call that shows the node answers them: all equal."""
        got = []
        n = self.core.GetNode(core_pb2.GetNodeOptions(nodename=node), timeout=10)
        got.append((n.resource_capacity, n.resource_usage))
        for n in self.core.ListPodNodes(core_pb2.ListNodesOptions(
                podname=pod, all=True, skip_info=True), timeout=10):
            got.append((n.resource_capacity, n.resource_usage))
        r = self.core.GetNodeResource(core_pb2.GetNodeResourceOptions(
            opts=core_pb2.GetNodeOptions(nodename=node)), timeout=10)
        self.assertEqual(list(r.diffs), [])
        got.append((r.resource_capacity, r.resource_usage))
        for r in self.core.GetPodResource(core_pb2.GetPodOptions(name=pod), timeout=10):
            got.append((r.resource_capacity, r.resource_usage))
        self.assertEqual(len(got), 4)
        self.assertEqual(len(set(got)), 1, got)  # the same text everywhere
        return json.loads(got[0][0]), json.loads(got[0][1])

    def test_a_node_through_its_life(self):
        pod = self.add_pod()
        node = NODES[0]
        n = self.add_node(pod, node, {"cpumem": {"cpu": 2, "memory": "1G"},
                                      "storage": {"storage": "10G", "volumes": ["/data0:1G"]}})
        cap = {"cpumem": cpumem(2, {"0": 100, "1": 100}, G),
               "storage": storage({"/data0": G}, 11 * G)}
        idle = {"cpumem": cpumem(0, {"0": 0, "1": 0}, 0), "storage": storage({"/data0": 0}, 0)}
        self.assertEqual((json.loads(n.resource_capacity), json.loads(n.resource_usage)),
                         (cap, idle))
        self.assertEqual(self.views(pod, node), (cap, idle))

        # SetNode with a delta: one more core and 1 GiB; the shape stays.
        n = self.core.SetNode(core_pb2.SetNodeOptions(
            nodename=node, delta=True,
            resources={"cpumem": b'{"cpu": "2:100", "memory": "1G"}'}), timeout=10)
        cap["cpumem"] = cpumem(3, {"0": 100, "1": 100, "2": 100}, 2 * G)
        idle["cpumem"] = cpumem(0, {"0": 0, "1": 0, "2": 0}, 0)
        self.assertEqual((json.loads(n.resource_capacity), json.loads(n.resource_usage)),
                         (cap, idle))
        self.assertEqual(self.views(pod, node), (cap, idle))

        # Two instances of 0.1 core and 64 MiB each: usage counts cores requested and bytes.
        msgs = list(self.core.CreateWorkload(self.deploy(pod, 2, {
            "cpumem": {"cpu-request": 0.1, "memory-request": "64M"}}), timeout=60))
        self.assertEqual([m.success for m in msgs], [True, True], msgs)
        for m in msgs:
            self.assertEqual(m.nodename, node)
            self.assertIn('"cpu_request":0.1,', m.resources)  # shortest form, not 0.1000...01
            self.assertEqual(json.loads(m.resources)["cpumem"]["memory_request"], 64 * M)
        used = {"cpumem": cpumem(0.2, {"0": 0, "1": 0, "2": 0}, 128 * M),
                "storage": storage({"/data0": 0}, 0)}
        self.assertEqual(self.views(pod, node), (cap, used))

        # Removed: the usage is back to zeros, in the same shape.
        self.remove([m.id for m in msgs])
        self.assertEqual(self.views(pod, node), (cap, idle))
        self.core.RemoveNode(core_pb2.RemoveNodeOptions(nodename=node), timeout=10)


class Ties(Base):
    def test_tied_nodes_share_the_deploys(self):
        pod = self.add_pod()
        nodes = NODES[1:]
        for node in nodes:
            self.add_node(pod, node, {"cpumem": {"cpu": 2, "memory": "1G"},
                                      "storage": {"storage": "1G"}})
        # Nothing requested: every node fits without bound, and each deploy is a new app, so
        # no node has instances of it: every node ties in every plan.
        landed, ids = [], []
        for _ in range(12):
            msgs = list(self.core.CreateWorkload(self.deploy(pod, 1, {}), timeout=60))
            self.assertEqual([m.success for m in msgs], [True], msgs)
            self.assertIn(msgs[0].nodename, nodes)
            landed.append(msgs[0].nodename)
            ids.append(msgs[0].id)
        self.assertGreater(len(set(landed)), 1, landed)
        self.remove(ids)


if __name__ == "__main__":
    unittest.main()
