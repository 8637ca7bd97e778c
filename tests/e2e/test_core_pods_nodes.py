"""End-to-end tests of pb.CoreRPC's pods, nodes and liveness (the registry).

Real processes only: a redis-server and pivirt-gateway, driven by Debian's python3-grpcio with
stubs generated from proto/ (build/py) for the success paths. Eru's per-call error codes (1021,
1031, ...) are not canonical gRPC codes and python's grpcio hangs on them, so the failures are
read at the HTTP/2 level with nghttp (pvtest.grpc_trailers).

One stack (Redis, two gateways) serves every class, started once for the module; AgentEngine
has its own, with a node agent.

Classes:
  Pods         AddPod / GetPod / ListPods / RemovePod.
  Nodes        a pod with process:// nodes: AddNode, GetNode, GetNodeEngineInfo, ListPodNodes
               (all vs live, labels, skip_info), SetNode (bypass, labels, resources, endpoint),
               SetNodeStatus / GetNodeStatus with TTL expiry, RemoveNode.
  StatusStream NodeStatusStream sees alive -> dead on expiry and on deletion, once per change.
  EruCodes     every failure answers the call's Eru code with the cause in the message.
  AgentEngine  a real agent (pivirt-worker --set worker.node=N, no pod: it registers nothing)
               reports its engine info; AddNode without (or with partial) resources takes the
               machine's from it; Node.info and GetNodeEngineInfo carry it; SetNode delta adds
               and subtracts cores and memory and refuses to go below the node's usage, as
               does SetNode replacing resources; a clean stop deletes the report.
"""
import itertools
import json
import os
import socket
import threading
import time
import unittest

import grpc

import pvtest
from pb import core_pb2, core_pb2_grpc

TRUE, FALSE, KEEP = 1, 2, 0
SLACK = float(os.environ.get("PV_TIME_SLACK", "1.0"))
CPUMEM = b'{"cpu": 4, "memory": "8G"}'

_counter = itertools.count(1)


def uniq(prefix):
    return "%s-%d-%d" % (prefix, os.getpid(), next(_counter))


_stack = None


def setUpModule():
    global _stack
    _stack = pvtest.Stack(gateways=2)
    _stack.start()


def tearDownModule():
    _stack.stop()


grpc_trailers = pvtest.grpc_trailers


def wait_for(pred, timeout, step=0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return pred()


class Base(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stack = _stack
        cls.ch = cls.stack.channel(0)
        cls.core = core_pb2_grpc.CoreRPCStub(cls.ch)
        cls.core2 = core_pb2_grpc.CoreRPCStub(cls.stack.channel(1))
        cls.addr = cls.stack.gateways[0].addrs[0]

    def add_pod(self, name=None, desc="a pod"):
        name = name or uniq("pod")
        pod = self.core.AddPod(core_pb2.AddPodOptions(name=name, desc=desc), timeout=10)
        return pod.name

    def add_node(self, pod, name=None, labels=None, endpoint="process://"):
        name = name or uniq("node")
        return self.core.AddNode(core_pb2.AddNodeOptions(
            nodename=name, endpoint=endpoint, podname=pod, labels=labels or {},
            resources={"cpumem": CPUMEM}), timeout=10)

    def names(self, pod, all=False, labels=None, skip_info=False):
        return [n.name for n in self.core.ListPodNodes(core_pb2.ListNodesOptions(
            podname=pod, all=all, labels=labels or {}, skip_info=skip_info), timeout=10)]

    def status(self, node, ttl):
        self.core.SetNodeStatus(core_pb2.SetNodeStatusOptions(nodename=node, ttl=ttl), timeout=10)

    def eru(self, method, msg):
        t = grpc_trailers(self.addr, "/pb.CoreRPC/" + method, msg.SerializeToString())
        return int(t.get("grpc-status", "-1")), t.get("grpc-message", "")


class Pods(Base):
    def test_add_get_list_remove(self):
        a, b = uniq("zz-b"), uniq("zz-a")
        pod = self.core.AddPod(core_pb2.AddPodOptions(name=a, desc="first"), timeout=10)
        self.assertEqual((pod.name, pod.desc), (a, "first"))
        self.add_pod(b, desc="second")
        got = self.core.GetPod(core_pb2.GetPodOptions(name=a), timeout=10)
        self.assertEqual((got.name, got.desc), (a, "first"))
        listed = [(p.name, p.desc) for p in self.core.ListPods(core_pb2.Empty(), timeout=10).pods]
        self.assertEqual(listed, sorted(listed))
        self.assertIn((a, "first"), listed)
        self.assertIn((b, "second"), listed)
        self.core.RemovePod(core_pb2.RemovePodOptions(name=a), timeout=10)
        listed = [p.name for p in self.core.ListPods(core_pb2.Empty(), timeout=10).pods]
        self.assertNotIn(a, listed)
        self.assertIn(b, listed)
        code, msg = self.eru("GetPod", core_pb2.GetPodOptions(name=a))
        self.assertEqual(code, 1023)
        self.assertEqual(msg, "pod %s not found" % a)
        # The record is in Redis under the registry's hash tag.
        self.assertEqual(self.stack.redis.cmd("HEXISTS", self.stack.key("{reg}:pods"), b), 1)


class Nodes(Base):
    def test_nodes_of_a_pod(self):
        pod = self.add_pod()
        n1 = self.add_node(pod, "n1-" + pod, labels={"zone": "a"})
        self.assertEqual(n1.name, "n1-" + pod)
        self.assertEqual(n1.endpoint, "process://")
        self.assertEqual(n1.podname, pod)
        self.assertFalse(n1.available)
        self.assertFalse(n1.bypass)
        self.assertEqual(dict(n1.labels), {"zone": "a"})
        # Eru's documents, whatever form AddNode was given (4 cores, "8G")
        self.assertEqual(json.loads(n1.resource_capacity), eru_docs(
            {str(i): 100 for i in range(4)}, 8 << 30, 0))
        self.assertEqual(json.loads(n1.resource_usage), eru_docs(
            {str(i): 0 for i in range(4)}, 0, 0, cpu=0))
        self.assertEqual(json.loads(n1.info)["engine"], "process")
        self.add_node(pod, "n2-" + pod, labels={"zone": "a"})
        self.add_node(pod, "n3-" + pod, labels={"zone": "b"})
        names = ["n1-" + pod, "n2-" + pod, "n3-" + pod]

        got = self.core.GetNode(core_pb2.GetNodeOptions(nodename=names[1]), timeout=10)
        self.assertEqual((got.name, got.podname), (names[1], pod))
        eng = self.core.GetNodeEngineInfo(core_pb2.GetNodeOptions(nodename=names[2]), timeout=10)
        self.assertEqual(eng.type, "process")

        # No agent is alive: every node is down, listed only with all.
        self.assertEqual(self.names(pod, all=True), names)
        self.assertEqual(self.names(pod), [])
        self.assertEqual(self.names(pod, all=True, labels={"zone": "a"}), names[:2])
        nodes = list(self.core.ListPodNodes(core_pb2.ListNodesOptions(
            podname=pod, all=True, skip_info=True), timeout=10))
        self.assertEqual([n.info for n in nodes], ["", "", ""])

        # Liveness: n1 for long, n2 for 2 s.
        self.status(names[0], 60)
        self.status(names[1], 2)
        self.assertEqual(self.names(pod), names[:2])
        st = self.core.GetNodeStatus(core_pb2.GetNodeStatusOptions(nodename=names[0]), timeout=10)
        self.assertEqual((st.nodename, st.podname, st.alive), (names[0], pod, True))
        ttl = self.stack.redis.cmd("TTL", self.stack.key("{reg}:alive:" + names[0]))
        self.assertTrue(50 < ttl <= 60, ttl)
        self.assertEqual(wait_for(lambda: self.names(pod) == names[:1], 6 * SLACK), True)
        # its status key ran out: Eru answers the call's code (1038), not alive=false
        code, msg = self.eru("GetNodeStatus", core_pb2.GetNodeStatusOptions(nodename=names[1]))
        self.assertEqual((code, msg), (1038, "node status of %s not found: never set, or its "
                                             "ttl ran out" % names[1]))
        code, _ = self.eru("GetNodeStatus", core_pb2.GetNodeStatusOptions(nodename=names[2]))
        self.assertEqual(code, 1038)  # never set
        self.assertTrue(self.core.GetNode(core_pb2.GetNodeOptions(nodename=names[0]),
                                          timeout=10).available)

        # Bypass takes a live node down; FALSE brings it back; KEEP keeps it.
        n = self.core.SetNode(core_pb2.SetNodeOptions(nodename=names[0], bypass=TRUE), timeout=10)
        self.assertTrue(n.bypass)
        self.assertEqual(self.names(pod), [])
        n = self.core.SetNode(core_pb2.SetNodeOptions(nodename=names[0], bypass=KEEP), timeout=10)
        self.assertTrue(n.bypass)
        n = self.core.SetNode(core_pb2.SetNodeOptions(nodename=names[0], bypass=FALSE), timeout=10)
        self.assertFalse(n.bypass)
        self.assertEqual(self.names(pod), names[:1])

        # Labels are replaced when given, kept otherwise; resources replaced; endpoint changes
        # the engine.
        n = self.core.SetNode(core_pb2.SetNodeOptions(
            nodename=names[2], labels={"disk": "ssd"}, endpoint="virt://qemu:///system",
            resources={"storage": b'{"storage": "1T"}'}, workloads_down=True), timeout=10)
        self.assertEqual(dict(n.labels), {"disk": "ssd"})
        self.assertEqual(n.endpoint, "virt://qemu:///system")
        self.assertEqual(json.loads(n.resource_capacity), eru_docs({}, 0, 1 << 40))
        eng = self.core.GetNodeEngineInfo(core_pb2.GetNodeOptions(nodename=names[2]), timeout=10)
        self.assertEqual(eng.type, "virt")
        n = self.core.SetNode(core_pb2.SetNodeOptions(nodename=names[2]), timeout=10)
        self.assertEqual(dict(n.labels), {"disk": "ssd"})

        # Removal: nodes first, then the pod.
        for name in names:
            self.core.RemoveNode(core_pb2.RemoveNodeOptions(nodename=name), timeout=10)
        self.assertEqual(self.names(pod, all=True), [])
        self.assertEqual(self.stack.redis.cmd("EXISTS", self.stack.key("{reg}:alive:" + names[0])), 0)
        self.core.RemovePod(core_pb2.RemovePodOptions(name=pod), timeout=10)

    def test_docker_endpoint_is_stored(self):
        pod = self.add_pod()
        n = self.add_node(pod, endpoint="tcp://10.0.0.9:2376")
        eng = self.core.GetNodeEngineInfo(core_pb2.GetNodeOptions(nodename=n.name), timeout=10)
        self.assertEqual(eng.type, "docker")


class StatusStream(Base):
    """Two gateways: each stream, on either gateway, sees every change exactly once."""

    def watch(self, core):
        got, lock = [], threading.Lock()
        stream = core.NodeStatusStream(core_pb2.Empty(), timeout=60)
        self.addCleanup(stream.cancel)  # also when an assertion fails

        def read():
            try:
                for m in stream:
                    with lock:
                        got.append((m.nodename, m.podname, m.alive))
            except grpc.RpcError:
                pass

        t = threading.Thread(target=read, daemon=True)
        t.start()

        def seen():
            with lock:
                return list(got)

        return stream, t, seen

    def test_alive_then_dead_on_expiry_and_deletion(self):
        pod = self.add_pod()
        a = self.add_node(pod).name
        b = self.add_node(pod).name
        watches = [self.watch(self.core), self.watch(self.core2)]
        time.sleep(1.0)  # the streams are registered by then
        self.status(a, 2)
        self.status(a, 2)  # a refresh is not a change
        self.status(b, 60)
        self.status(b, -1)  # deletion

        want = [(a, pod, True), (b, pod, True), (b, pod, False), (a, pod, False)]
        def mine(seen):
            # Other tests' nodes may still expire meanwhile: only these two count.
            return [e for e in seen() if e[0] in (a, b)]

        for stream, t, seen in watches:
            wait_for(lambda: len(mine(seen)) >= 4, 8 * SLACK)
        time.sleep(0.3)
        for stream, t, seen in watches:
            evs = mine(seen)
            self.assertEqual(sorted(evs), sorted(want))
            # Per node: alive before dead.
            self.assertLess(evs.index((a, pod, True)), evs.index((a, pod, False)))
            self.assertLess(evs.index((b, pod, True)), evs.index((b, pod, False)))
            stream.cancel()
            t.join(5)

    def test_removed_node_reports_dead(self):
        pod = self.add_pod()
        a = self.add_node(pod).name
        stream, t, seen = self.watch(self.core)
        time.sleep(1.0)
        self.status(a, 60)

        def mine():
            return [e for e in seen() if e[0] == a]

        self.assertTrue(wait_for(lambda: mine() == [(a, pod, True)], 5 * SLACK), seen())
        self.core.RemoveNode(core_pb2.RemoveNodeOptions(nodename=a), timeout=10)
        # The record is gone with the key, so the message cannot name the pod.
        wait_for(lambda: len(mine()) >= 2, 5 * SLACK)
        time.sleep(0.2)
        self.assertEqual(mine(), [(a, pod, True), (a, "", False)])
        stream.cancel()
        t.join(5)


class StreamAcrossReconnect(StatusStream):
    """The watchers reconnect when Redis drops their connection, turn the notifications on
    again and go on.

    Its own stack, on a Redis without ops/redis.acl's users: turning the notifications on is
    for a Redis the operator runs with other users (ops/redis.acl gives the programs no CONFIG,
    and ops/redis.conf sets the notifications)."""

    test_alive_then_dead_on_expiry_and_deletion = None
    test_removed_node_reports_dead = None

    @classmethod
    def setUpClass(cls):
        cls.own_stack = pvtest.Stack(gateways=2, redis_acl=False)
        cls.own_stack.start()
        cls.stack = cls.own_stack
        cls.ch = cls.stack.channel(0)
        cls.core = core_pb2_grpc.CoreRPCStub(cls.ch)
        cls.core2 = core_pb2_grpc.CoreRPCStub(cls.stack.channel(1))
        cls.addr = cls.stack.gateways[0].addrs[0]

    @classmethod
    def tearDownClass(cls):
        cls.own_stack.stop()

    def test_stream_survives_a_dropped_connection(self):
        pod = self.add_pod()
        a = self.add_node(pod).name
        stream, t, seen = self.watch(self.core)
        time.sleep(1.0)
        redis = self.stack.redis

        def watchers():
            # Connections with a pattern subscription: one watcher per gateway.
            clients = redis.cmd("CLIENT", "LIST", "TYPE", "pubsub").splitlines()
            return sum(1 for c in clients if " psub=1 " in c + " ")

        self.assertEqual(watchers(), 2)
        redis.cmd("CONFIG", "SET", "notify-keyspace-events", "")
        redis.cmd("CLIENT", "KILL", "TYPE", "pubsub")

        def resubscribed():
            flags = redis.cmd("CONFIG", "GET", "notify-keyspace-events")[1]
            return watchers() == 2 and all(c in flags for c in "K$gx")

        self.assertTrue(wait_for(resubscribed, 10 * SLACK))
        self.status(a, 60)
        self.assertTrue(wait_for(lambda: (a, pod, True) in seen(), 5 * SLACK), seen())
        self.status(a, -1)
        self.assertTrue(wait_for(lambda: (a, pod, False) in seen(), 5 * SLACK), seen())
        self.assertEqual([e for e in seen() if e[0] == a], [(a, pod, True), (a, pod, False)])
        stream.cancel()
        t.join(5)


class EruCodes(Base):
    def test_codes(self):
        pod = self.add_pod()
        node = self.add_node(pod).name

        code, msg = self.eru("AddPod", core_pb2.AddPodOptions(name=pod))
        self.assertEqual((code, msg), (1021, "pod %s already exists" % pod))
        code, msg = self.eru("AddPod", core_pb2.AddPodOptions(name="a/b"))
        self.assertEqual(code, 1021)
        self.assertIn("name", msg)
        t = grpc_trailers(self.addr, "/pb.CoreRPC/AddPod", b"\xff\xff")
        self.assertEqual(t.get("grpc-status"), "1021")

        code, msg = self.eru("RemovePod", core_pb2.RemovePodOptions(name=pod))
        self.assertEqual((code, msg), (1022, "pod %s still has 1 node(s): remove them first" % pod))

        code, msg = self.eru("AddNode", core_pb2.AddNodeOptions(
            nodename=uniq("n"), endpoint="process://", podname="no-such-pod",
            resources={"cpumem": CPUMEM}))
        self.assertEqual((code, msg), (1031, "pod no-such-pod not found"))
        # No agent has reported for the node: resources must be complete.
        want = ("no agent has reported engine info for node lonely: start its agent "
                "(pivirt-worker --set worker.node=lonely) or give resources")
        code, msg = self.eru("AddNode", core_pb2.AddNodeOptions(
            nodename="lonely", endpoint="process://", podname=pod))
        self.assertEqual(code, 1031)
        self.assertTrue(msg.startswith(want), msg)
        code, msg = self.eru("AddNode", core_pb2.AddNodeOptions(
            nodename="lonely", endpoint="process://", podname=pod,
            resources={"cpumem": b'{"cpu": 2}', "storage": b'{"storage": "1T"}'}))
        self.assertEqual(code, 1031)
        self.assertTrue(msg.startswith(want), msg)
        # ... and the given documents are checked before that.
        code, msg = self.eru("AddNode", core_pb2.AddNodeOptions(
            nodename="lonely", endpoint="process://", podname=pod,
            resources={"cpumem": b'{"memory": "-1G"}'}))
        self.assertEqual(code, 1031)
        self.assertTrue(msg.startswith("resources: cpumem"), msg)
        self.assertIn("memory", msg)
        code, msg = self.eru("AddNode", core_pb2.AddNodeOptions(
            nodename="lonely", endpoint="process://", podname=pod,
            resources={"cpumem": b'{"cpus": 2}'}))
        self.assertEqual(code, 1031)
        self.assertIn("cpus", msg)
        self.assertEqual(self.stack.redis.cmd("HEXISTS", self.stack.key("{reg}:nodes"), "lonely"), 0)
        code, msg = self.eru("AddNode", core_pb2.AddNodeOptions(
            nodename=uniq("n"), endpoint="http://x", podname=pod, resources={"cpumem": CPUMEM}))
        self.assertEqual(code, 1031)
        self.assertIn("http://x", msg)
        code, msg = self.eru("AddNode", core_pb2.AddNodeOptions(
            nodename=uniq("n"), endpoint="process://", podname=pod, resources={"cpumem": b"[1]"}))
        self.assertEqual(code, 1031)
        self.assertIn("resources[cpumem]", msg)
        code, msg = self.eru("AddNode", core_pb2.AddNodeOptions(
            nodename=uniq("n"), endpoint="process://", podname=pod,
            resources={"cpumem": b'{"cpu": 4, "memory": "-1G"}'}))
        self.assertEqual(code, 1031)
        self.assertTrue(msg.startswith("resources: cpumem"), msg)
        self.assertIn("memory", msg)
        code, msg = self.eru("AddNode", core_pb2.AddNodeOptions(
            nodename=node, endpoint="process://", podname=pod, resources={"cpumem": CPUMEM}))
        self.assertEqual((code, msg), (1031, "node %s already exists" % node))

        code, msg = self.eru("GetNode", core_pb2.GetNodeOptions(nodename="ghost"))
        self.assertEqual((code, msg), (1034, "node ghost not found"))
        code, msg = self.eru("RemoveNode", core_pb2.RemoveNodeOptions(nodename="ghost"))
        self.assertEqual((code, msg), (1032, "node ghost not found"))
        code, msg = self.eru("ListPodNodes", core_pb2.ListNodesOptions(podname="ghost"))
        self.assertEqual((code, msg), (1033, "pod ghost not found"))
        code, msg = self.eru("SetNode", core_pb2.SetNodeOptions(
            nodename=node, delta=True, resources={"cpumem": b'{"memory": "-9G"}'}))
        self.assertEqual(code, 1035)
        self.assertIn("cpumem", msg)
        self.assertIn("memory", msg)
        code, msg = self.eru("SetNode", core_pb2.SetNodeOptions(
            nodename=node, resources={"cpumem": b'{"cpu": 4}'}))
        self.assertEqual(code, 1035)
        self.assertIn("memory", msg)
        code, msg = self.eru("SetNode", core_pb2.SetNodeOptions(
            nodename="ghost", delta=True, resources={"cpumem": CPUMEM}))
        self.assertEqual((code, msg), (1035, "node ghost not found"))
        code, msg = self.eru("SetNodeStatus", core_pb2.SetNodeStatusOptions(nodename=node, ttl=0))
        self.assertEqual(code, 1036)
        self.assertIn("ttl: 0", msg)
        code, msg = self.eru("SetNodeStatus", core_pb2.SetNodeStatusOptions(nodename="ghost", ttl=5))
        self.assertEqual((code, msg), (1036, "node ghost not found"))
        code, msg = self.eru("GetNodeStatus", core_pb2.GetNodeStatusOptions(nodename="ghost"))
        self.assertEqual((code, msg), (1038, "node ghost not found"))
        code, msg = self.eru("GetNodeEngineInfo", core_pb2.GetNodeOptions(nodename="ghost"))
        self.assertEqual((code, msg), (1038, "node ghost not found"))


def mem_total():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal in /proc/meminfo")


def cores(resources):
    """{core id: pieces} of Eru's cpumem document (its cpu_map), checking that its cpu counts
    them."""
    cpu_map = resources["cpumem"]["cpu_map"]
    assert resources["cpumem"]["cpu"] == len(cpu_map), resources
    return {int(i): p for i, p in cpu_map.items()}


def eru_docs(cpu_map, memory, storage, cpu=None):
    """Eru's cpumem and storage documents of a node without NUMA layout or volumes."""
    return {"cpumem": {"cpu": len(cpu_map) if cpu is None else cpu, "cpu_map": cpu_map,
                       "memory": memory, "numa_memory": {}, "numa": {}},
            "storage": {"volumes": {}, "disks": [], "storage": storage}}


class AgentEngine(Base):
    """A node agent started before its node exists, then everything the engine info drives."""

    HEARTBEAT = 1

    @classmethod
    def setUpClass(cls):
        cls.node = uniq("agent")
        cls.stack = pvtest.Stack(gateways=1, agents=[(cls.node, "")],
                                 config={"worker.heartbeat_seconds": cls.HEARTBEAT})
        cls.stack.start()
        cls.ch = cls.stack.channel(0)
        cls.core = core_pb2_grpc.CoreRPCStub(cls.ch)
        cls.addr = cls.stack.gateways[0].addrs[0]

    @classmethod
    def tearDownClass(cls):
        cls.stack.stop()

    def report(self):
        raw = self.stack.redis.cmd("GET", self.stack.key("{reg}:engine-info:" + self.node))
        return json.loads(raw) if raw else None

    def node_key(self, name):
        node_id = self.stack.redis.cmd("HGET", self.stack.key("{reg}:nodes"), name)
        return self.stack.key("{reg}:node:" + node_id)

    def set_usage(self, name, usage):
        """What a reservation does to a node (sched.lua): new usage, next revision."""
        key = self.node_key(name)
        self.stack.redis.cmd("HSET", key, "usage", json.dumps(usage))
        self.stack.redis.cmd("HINCRBY", key, "usage_rev", 1)

    def set_node(self, name, resources, delta):
        return self.core.SetNode(core_pb2.SetNodeOptions(
            nodename=name, delta=delta,
            resources={k: json.dumps(v).encode() for k, v in resources.items()}), timeout=10)

    def test_engine_info_add_node_and_set_node(self):
        node, cpus, mem = self.node, os.cpu_count(), mem_total()
        st = os.statvfs(self.stack.data_dir)
        storage = st.f_blocks * st.f_frsize

        # The agent reports before its node exists, with the alive key's TTL (three beats).
        info = wait_for(self.report, 5 * SLACK)
        machine, conditions = info.pop("machine"), info.pop("conditions")
        self.assertEqual(info, {
            "type": "process", "cpu_count": cpus, "mem_total": mem, "storage_total": storage,
            "hostname": socket.gethostname(), "version": info["version"],
            "kernel": os.uname().release})
        # what ClusterService shows of the machine, and the pressure conditions it makes
        self.assertEqual(machine["mem_total"], mem)
        self.assertTrue(0 < machine["mem_available"] <= mem)
        self.assertEqual(machine["disk_total"], storage)
        self.assertGreater(machine["pid_max"], 0)
        self.assertGreater(machine["tasks"], 0)
        self.assertEqual(sorted(conditions), ["disk_pressure", "memory_pressure",
                                              "network_unavailable", "pid_pressure"])
        self.assertTrue(info["version"])
        ttl = self.stack.redis.cmd("TTL", self.stack.key("{reg}:engine-info:" + node))
        self.assertTrue(0 < ttl <= 3 * self.HEARTBEAT, ttl)
        code, msg = self.eru("GetNode", core_pb2.GetNodeOptions(nodename=node))
        self.assertEqual((code, msg), (1034, "node %s not found" % node))

        # AddNode without resources: the machine's, with the plugins' defaults.
        pod = self.add_pod()
        n = self.core.AddNode(core_pb2.AddNodeOptions(
            nodename=node, endpoint="process://", podname=pod), timeout=10)
        res = json.loads(n.resource_capacity)
        self.assertEqual(cores(res), {i: 100 for i in range(cpus)})
        self.assertEqual(res["cpumem"]["memory"], mem // 10 * 8)
        self.assertEqual(res["storage"]["storage"], storage // 10 * 8)
        got = json.loads(n.info)
        self.assertEqual((got["type"], got["cpu_count"], got["hostname"], got["engine"]),
                         ("process", cpus, socket.gethostname(), "process"))
        self.assertEqual(json.loads(n.resource_usage), eru_docs(
            {str(i): 0 for i in range(cpus)}, 0, 0, cpu=0))
        # The agent's next beat makes it alive.
        self.assertTrue(wait_for(lambda: self.core.GetNode(core_pb2.GetNodeOptions(
            nodename=node), timeout=10).available, 5 * SLACK))
        eng = self.core.GetNodeEngineInfo(core_pb2.GetNodeOptions(nodename=node), timeout=10)
        self.assertEqual(eng.type, "process")
        listed = list(self.core.ListPodNodes(core_pb2.ListNodesOptions(
            podname=pod, timeout_in_second=1), timeout=10))
        self.assertEqual([m.name for m in listed], [node])
        got = json.loads(listed[0].info)
        self.assertEqual((got["cpu_count"], got["mem_total"], got["alive"]), (cpus, mem, True))
        listed = list(self.core.ListPodNodes(core_pb2.ListNodesOptions(
            podname=pod, skip_info=True), timeout=10))
        self.assertEqual([m.info for m in listed], [""])

        # Partial resources: what is given stays, the rest comes from the report.
        self.core.RemoveNode(core_pb2.RemoveNodeOptions(nodename=node), timeout=10)
        n = self.core.AddNode(core_pb2.AddNodeOptions(
            nodename=node, endpoint="process://", podname=pod,
            resources={"cpumem": b'{"cpu": 1}', "storage": b'{"storage": "1G"}'}), timeout=10)
        res = json.loads(n.resource_capacity)
        self.assertEqual(cores(res), {0: 100})
        self.assertEqual(res["cpumem"]["memory"], mem // 10 * 8)
        self.assertEqual(res["storage"]["storage"], 1 << 30)
        # Given documents are still checked first.
        code, msg = self.eru("AddNode", core_pb2.AddNodeOptions(
            nodename=uniq("n"), endpoint="process://", podname=pod,
            resources={"cpumem": b'{"memory": "-1G"}'}))
        self.assertEqual(code, 1031)
        self.assertTrue(msg.startswith("resources: cpumem"), msg)

        # SetNode delta: two more cores and 1 GiB, then both taken back.
        base_mem = mem // 10 * 8
        n = self.set_node(node, {"cpumem": {"cpu": "1:100,2:100", "memory": "1G"}}, delta=True)
        res = json.loads(n.resource_capacity)
        self.assertEqual(cores(res), {0: 100, 1: 100, 2: 100})
        self.assertEqual(res["cpumem"]["memory"], base_mem + (1 << 30))
        self.assertEqual(res["storage"]["storage"], 1 << 30)
        n = self.set_node(node, {"cpumem": {"cpu": "2:-100", "memory": "-512M"}}, delta=True)
        res = json.loads(n.resource_capacity)
        self.assertEqual(cores(res), {0: 100, 1: 100})
        self.assertEqual(res["cpumem"]["memory"], base_mem + (512 << 20))

        # With usage on the node (cores 0 and 1 bound, 1 GiB held), neither a delta nor a
        # replacement may go below it; the refused write leaves the node as it was.
        usage = {"cpumem": {"cpu_request": 2, "cpu_limit": 2, "memory_request": 1 << 30,
                            "memory_limit": 1 << 30, "cpu_map": {"0": 100, "1": 100}}}
        self.set_usage(node, usage)
        before = self.stack.redis.cmd("HGET", self.node_key(node), "resources")
        code, msg = self.eru("SetNode", core_pb2.SetNodeOptions(
            nodename=node, delta=True,
            resources={"cpumem": json.dumps({"memory": -(base_mem + (512 << 20))}).encode()}))
        self.assertEqual(code, 1035)
        self.assertIn("cpumem", msg)
        self.assertIn("memory", msg)
        code, msg = self.eru("SetNode", core_pb2.SetNodeOptions(
            nodename=node, delta=True, resources={"cpumem": b'{"cpu": "1:-100"}'}))
        self.assertEqual(code, 1035)
        self.assertIn("cpumem", msg)
        code, msg = self.eru("SetNode", core_pb2.SetNodeOptions(
            nodename=node, resources={"cpumem": b'{"cpu": 2, "memory": "512M"}'}))
        self.assertEqual(code, 1035)
        self.assertIn("cpumem", msg)
        self.assertIn("memory", msg)
        self.assertEqual(self.stack.redis.cmd("HGET", self.node_key(node), "resources"), before)
        # Above the usage both go through; the usage is shown as the record holds it.
        n = self.set_node(node, {"cpumem": {"memory": "-512M"}}, delta=True)
        self.assertEqual(json.loads(n.resource_capacity)["cpumem"]["memory"], base_mem)
        self.assertEqual(json.loads(n.resource_usage), eru_docs(
            {"0": 100, "1": 100}, 1 << 30, 0, cpu=2))
        n = self.set_node(node, {"cpumem": {"cpu": 2, "memory": "2G"}}, delta=False)
        self.assertEqual(json.loads(n.resource_capacity),
                         eru_docs({"0": 100, "1": 100}, 2 << 30, 0))

        # A clean stop deletes the report and the alive key; the engine type then comes from
        # the endpoint, and Node.info keeps only what the registry knows.
        agent = self.stack.agents[0]
        self.assertEqual(agent.stop(), 0)
        self.assertIsNone(self.report())
        self.assertEqual(self.stack.redis.cmd("EXISTS", self.stack.key("{reg}:alive:" + node)), 0)
        eng = self.core.GetNodeEngineInfo(core_pb2.GetNodeOptions(nodename=node), timeout=10)
        self.assertEqual(eng.type, "process")
        n = self.core.GetNode(core_pb2.GetNodeOptions(nodename=node), timeout=10)
        self.assertFalse(n.available)
        self.assertEqual(sorted(json.loads(n.info)), ["alive", "engine", "id", "ip", "role"])
        # Without a report, AddNode needs complete resources again.
        code, msg = self.eru("AddNode", core_pb2.AddNodeOptions(
            nodename=uniq("n"), endpoint="process://", podname=pod))
        self.assertEqual(code, 1031)
        self.assertIn("no agent has reported engine info", msg)


if __name__ == "__main__":
    pvtest.main()
