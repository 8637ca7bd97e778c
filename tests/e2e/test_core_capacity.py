"""End-to-end tests of pb.CoreRPC's resource calls: CalculateCapacity (a plan request answered by
a pivirt-scheduler through Redis), GetNodeResource and GetPodResource.

Real processes only: redis-server, two pivirt-gateways, two pivirt-schedulers, and Debian's
python3-grpcio. Eru's per-call codes (1041, ...) are read at the HTTP/2 level
(pvtest.grpc_trailers) because grpcio hangs on codes that are not canonical.

Classes:
  Capacity      DUMMY gives the capacity of each node where one fits, and the total; AUTO/EACH/FILL give the plan
                (ties between nodes broken differently from call to call);
                both gateways answer the same; down nodes are skipped unless named or `all`;
                node filter includes/excludes/labels; capacity is capped by memory and cores.
  CapacityErrors  not enough resource ("need: N, available: M"), bad resource documents naming
                the plugin and field, missing entrypoint, unknown pod: all with code 1041.
  Takeover      a scheduler frozen with SIGSTOP holds requests; the other takes them over after
                scheduler.claim_idle_ms and every call is answered.
  Resources     GetNodeResource reports the materialised capacity, the usage and no diffs; a
                usage that drifted from the allocations shows diffs, fix rewrites it;
                GetPodResource streams every node of the pod; unknown node/pod codes.
  NoScheduler   without a live scheduler CalculateCapacity fails at once with a clear message.
"""
import itertools
import json
import os
import signal
import threading
import time
import unittest

import pvtest
from pb import core_pb2, core_pb2_grpc

_counter = itertools.count(1)
_stack = None
AUTO, FILL, EACH, GLOBAL, DRAINED, DUMMY = 0, 1, 2, 3, 4, 99


def uniq(prefix):
    return "%s-%d-%d" % (prefix, os.getpid(), next(_counter))


def setUpModule():
    global _stack
    _stack = pvtest.Stack(gateways=2, schedulers=2,
                          config={"scheduler": {"claim_idle_ms": 500}})
    _stack.start()


def tearDownModule():
    _stack.stop()


def eru_docs(cpu_map, memory, cpu=None):
    """Eru's cpumem and storage documents of a node without NUMA layout, volumes or storage."""
    return {"cpumem": {"cpu": len(cpu_map) if cpu is None else cpu, "cpu_map": cpu_map,
                       "memory": memory, "numa_memory": {}, "numa": {}},
            "storage": {"volumes": {}, "disks": [], "storage": 0}}


def mem(req):
    return {"cpumem": json.dumps({"memory-request": req}).encode()}


class Base(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stack = _stack
        cls.core = core_pb2_grpc.CoreRPCStub(cls.stack.channel(0))
        cls.core2 = core_pb2_grpc.CoreRPCStub(cls.stack.channel(1))
        cls.addr = cls.stack.gateways[0].addrs[0]

    def pod(self, nodes, labels=None, alive=True):
        """A pod with NODES: {name suffix: (cpu, memory)}; alive via SetNodeStatus."""
        pod = uniq("pod")
        self.core.AddPod(core_pb2.AddPodOptions(name=pod), timeout=10)
        names = {}
        for suffix, (cpu, memory) in nodes.items():
            name = "%s-%s" % (pod, suffix)
            names[suffix] = name
            self.core.AddNode(core_pb2.AddNodeOptions(
                nodename=name, endpoint="process://", podname=pod,
                labels=(labels or {}).get(suffix, {}),
                resources={"cpumem": json.dumps({"cpu": cpu, "memory": memory}).encode()}),
                timeout=10)
            if alive:
                self.core.SetNodeStatus(core_pb2.SetNodeStatusOptions(nodename=name, ttl=600),
                                        timeout=10)
        return pod, names

    def opts(self, pod, strategy=DUMMY, count=0, resources=None, **kw):
        return core_pb2.DeployOptions(
            name="app", entrypoint=core_pb2.EntrypointOptions(name="web"), podname=pod,
            deploy_strategy=strategy, count=count, resources=resources or mem("1G"), **kw)

    def eru(self, method, msg):
        t = pvtest.grpc_trailers(self.addr, "/pb.CoreRPC/" + method, msg.SerializeToString())
        return int(t.get("grpc-status", "-1")), t.get("grpc-message", "")


class Capacity(Base):
    def test_dummy_is_raw_capacity(self):
        pod, n = self.pod({"a": (4, "4G"), "b": (2, "2G"), "c": (8, "512M")})
        got = self.core.CalculateCapacity(self.opts(pod), timeout=10)
        # As Eru: only the nodes where at least one instance fits are listed.
        self.assertEqual(dict(got.node_capacities), {n["a"]: 4, n["b"]: 2})
        self.assertEqual(got.total, 6)
        # The other gateway asks the same schedulers and gets the same answer.
        got2 = self.core2.CalculateCapacity(self.opts(pod), timeout=10)
        self.assertEqual(dict(got2.node_capacities), dict(got.node_capacities))
        # Bound to 3 whole cores each: one instance on a 4-core node, none on 2 cores, and the
        # 8-core node is capped by its memory.
        res = {"cpumem": b'{"cpu-request": 3, "cpu-bind": true, "memory-request": "1G"}'}
        got = self.core.CalculateCapacity(self.opts(pod, resources=res), timeout=10)
        self.assertEqual(dict(got.node_capacities), {n["a"]: 1})

    def test_strategies_give_the_plan(self):
        pod, n = self.pod({"a": (4, "4G"), "b": (4, "4G"), "c": (4, "4G")})
        got = self.core.CalculateCapacity(self.opts(pod, AUTO, 5), timeout=10)
        self.assertEqual(got.total, 5)
        self.assertEqual(sorted(got.node_capacities.values()), [1, 2, 2])
        # The three nodes tie: EACH takes two of them, which two changes from call to call (as
        # Eru's map order does), and over calls every node is taken sometimes.
        taken = set()
        for _ in range(20):
            got = self.core.CalculateCapacity(self.opts(pod, EACH, 2, nodes_limit=2), timeout=10)
            self.assertEqual(got.total, 4)
            self.assertEqual(sorted(got.node_capacities.values()), [2, 2])
            self.assertTrue(set(got.node_capacities) <= set(n.values()), got.node_capacities)
            taken |= set(got.node_capacities)
        self.assertEqual(taken, set(n.values()))
        got = self.core.CalculateCapacity(self.opts(pod, FILL, 3), timeout=10)
        self.assertEqual(dict(got.node_capacities), {n["a"]: 3, n["b"]: 3, n["c"]: 3})
        got = self.core.CalculateCapacity(self.opts(pod, DRAINED, 6), timeout=10)
        self.assertEqual(got.total, 6)

    def test_down_nodes_and_filters(self):
        pod, n = self.pod({"a": (4, "4G"), "b": (4, "2G")},
                          labels={"a": {"zone": "x"}, "b": {"zone": "y"}})
        pod2, m = self.pod({"down": (4, "8G")}, alive=False)
        got = self.core.CalculateCapacity(self.opts(pod), timeout=10)
        self.assertEqual(got.total, 6)
        got = self.core.CalculateCapacity(self.opts(pod, nodelabels={"zone": "y"}), timeout=10)
        self.assertEqual(dict(got.node_capacities), {n["b"]: 2})
        got = self.core.CalculateCapacity(self.opts(pod, node_filter=core_pb2.NodeFilter(
            excludes=[n["b"]])), timeout=10)
        self.assertEqual(dict(got.node_capacities), {n["a"]: 4})
        # A node without a live agent takes part only when named or with all.
        code, msg = self.eru("CalculateCapacity", self.opts(pod2))
        self.assertEqual(code, 1041)
        self.assertIn("not enough resource", msg)
        got = self.core.CalculateCapacity(self.opts(pod2, node_filter=core_pb2.NodeFilter(
            all=True)), timeout=10)
        self.assertEqual(got.total, 8)
        got = self.core.CalculateCapacity(self.opts("", nodenames=[m["down"]]), timeout=10)
        self.assertEqual(dict(got.node_capacities), {m["down"]: 8})


class CapacityErrors(Base):
    def test_not_enough(self):
        pod, _ = self.pod({"a": (4, "4G"), "b": (2, "2G")})
        code, msg = self.eru("CalculateCapacity", self.opts(pod, AUTO, 7))
        self.assertEqual(code, 1041)
        self.assertIn("need: 7, available: 6", msg)
        code, msg = self.eru("CalculateCapacity", self.opts(pod, AUTO, 0))
        self.assertEqual(code, 1041)
        self.assertIn("count", msg)

    def test_bad_requests(self):
        pod, _ = self.pod({"a": (4, "4G")})
        code, msg = self.eru("CalculateCapacity", self.opts(pod, resources=mem("-1G")))
        self.assertEqual(code, 1041)
        self.assertIn("cpumem", msg)
        self.assertIn("memory-request", msg)
        code, msg = self.eru("CalculateCapacity", self.opts(
            pod, resources={"cpumem": b'{"cpu-request": 1, "bogus": 2}'}))
        self.assertEqual(code, 1041)
        self.assertIn("bogus", msg)
        code, msg = self.eru("CalculateCapacity", self.opts(pod, resources={"cpumem": b"{nope"}))
        self.assertEqual(code, 1041)
        self.assertIn("resources[cpumem]", msg)
        code, msg = self.eru("CalculateCapacity", core_pb2.DeployOptions(podname=pod))
        self.assertEqual(code, 1041)
        self.assertIn("entrypoint", msg)
        code, msg = self.eru("CalculateCapacity", self.opts(uniq("nopod")))
        self.assertEqual(code, 1041)
        self.assertIn("not found", msg)
        # Nothing was reserved by any of it.
        got = self.core.CalculateCapacity(self.opts(pod), timeout=10)
        self.assertEqual(got.total, 4)


class Takeover(Base):
    def test_frozen_scheduler_requests_taken_over(self):
        pod, _ = self.pod({"a": (4, "4G")})
        frozen = self.stack.schedulers[0]
        frozen.send_signal(signal.SIGSTOP)
        try:
            results, errors = [], []

            def ask():
                try:
                    results.append(self.core.CalculateCapacity(self.opts(pod), timeout=15).total)
                except Exception as e:  # noqa: BLE001 - reported below
                    errors.append(e)

            threads = [threading.Thread(target=ask) for _ in range(6)]
            t0 = time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.assertEqual(errors, [])
            self.assertEqual(results, [4] * 6)
            self.assertLess(time.monotonic() - t0, 12)
        finally:
            frozen.send_signal(signal.SIGCONT)


class Resources(Base):
    def test_node_resource(self):
        pod, n = self.pod({"a": (4, "4G")})
        got = self.core.GetNodeResource(core_pb2.GetNodeResourceOptions(
            opts=core_pb2.GetNodeOptions(nodename=n["a"])), timeout=10)
        self.assertEqual(got.name, n["a"])
        self.assertEqual(list(got.diffs), [])
        self.assertEqual(json.loads(got.resource_capacity), eru_docs(
            {str(i): 100 for i in range(4)}, 4 << 30))
        self.assertEqual(json.loads(got.resource_usage), eru_docs(
            {str(i): 0 for i in range(4)}, 0, cpu=0))

    def test_drifted_usage_shows_diffs_and_fix_rewrites_it(self):
        pod, n = self.pod({"a": (4, "4G")})
        node_id = self.stack.redis.cmd("HGET", self.stack.key("{reg}:nodes"), n["a"])
        key = self.stack.key("{reg}:node:%s" % node_id)
        self.stack.redis.cmd("HSET", key, "usage", '{"cpumem":{"memory_request":1073741824}}')
        req = core_pb2.GetNodeResourceOptions(opts=core_pb2.GetNodeOptions(nodename=n["a"]))
        got = self.core.GetNodeResource(req, timeout=10)
        self.assertEqual(len(got.diffs), 1)
        self.assertIn("memory_request", got.diffs[0])
        # The drift costs capacity until fixed.
        self.assertEqual(self.core.CalculateCapacity(self.opts(pod), timeout=10).total, 3)
        req.fix = True
        got = self.core.GetNodeResource(req, timeout=10)
        self.assertEqual(len(got.diffs), 1)
        self.assertEqual(json.loads(got.resource_usage), eru_docs(
            {str(i): 0 for i in range(4)}, 0, cpu=0))
        req.fix = False
        self.assertEqual(list(self.core.GetNodeResource(req, timeout=10).diffs), [])
        self.assertEqual(self.core.CalculateCapacity(self.opts(pod), timeout=10).total, 4)

    def test_pod_resource_streams_every_node(self):
        pod, n = self.pod({"a": (4, "4G"), "b": (2, "2G")}, alive=False)
        got = list(self.core.GetPodResource(core_pb2.GetPodOptions(name=pod), timeout=10))
        self.assertEqual(sorted(r.name for r in got), sorted(n.values()))
        for r in got:
            self.assertIn("cpumem", json.loads(r.resource_capacity))

    def test_unknown(self):
        code, msg = self.eru("GetNodeResource", core_pb2.GetNodeResourceOptions(
            opts=core_pb2.GetNodeOptions(nodename="nope-node")))
        self.assertEqual(code, 1037)
        self.assertIn("nope-node", msg)
        code, msg = self.eru("GetPodResource", core_pb2.GetPodOptions(name="nope-pod"))
        self.assertEqual(code, 1025)
        self.assertIn("nope-pod", msg)


class NoScheduler(unittest.TestCase):
    def test_fails_fast_without_a_scheduler(self):
        with pvtest.Stack(gateways=1, schedulers=0) as stack:
            core = core_pb2_grpc.CoreRPCStub(stack.channel(0))
            core.AddPod(core_pb2.AddPodOptions(name="p"), timeout=10)
            t0 = time.monotonic()
            t = pvtest.grpc_trailers(stack.gateways[0].addrs[0], "/pb.CoreRPC/CalculateCapacity",
                                     core_pb2.DeployOptions(
                                         podname="p", entrypoint=core_pb2.EntrypointOptions(
                                             name="web")).SerializeToString())
            self.assertEqual(t.get("grpc-status"), "1041")
            self.assertIn("no scheduler is running", t.get("grpc-message", ""))
            self.assertLess(time.monotonic() - t0, 5)


if __name__ == "__main__":
    unittest.main(verbosity=2)
