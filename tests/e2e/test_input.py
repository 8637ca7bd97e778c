"""End-to-end tests of hostile input to ClusterService and pb.CoreRPC (issue 22, sections 3 and
4, cluster and core side), through real clients against real processes: redis-server, a
gateway, a scheduler, an ops worker and the node agent of pod "in" (node "in1", process engine).
Eru's per-call codes are read at the HTTP/2 level (pvtest.grpc_trailers): python's grpcio
cannot represent them.

Classes:
  Deploy    CreateWorkload with a bad name, image, entrypoint name, dir, restart, publish,
            log.type, user, env, dns, extra_hosts, raw_args, modes (-1, past 07777) or
            nodes_limit -1 ends the whole call with 1074 naming the field and the value, before
            any stream message: no workload.create operation is written and the node's usage is
            unchanged. The same deploy with good values of those fields creates its instance.
            Send and SendLargeFile refuse modes outside 0..07777 (1062, 1063) before anything
            is sent.
  Tls       AddNode and SetNode refuse ca, cert and key that OpenSSL cannot read as PEM (1031,
            1035), an encrypted key and a key that is not the certificate's; openssl's own
            certificate and key are accepted.
  Counts    CreateCluster and UpdateCluster topology counts past PV_CLUSTER_TOPOLOGY_MAX (10000,
            2^31-1 included) and UpgradeCluster max_surge, max_unavailable and partition past
            the cluster's node count are INVALID_ARGUMENT naming the field and the value, and
            no upgrade operation is written.
  Overflow  SetNode deltas of +-2^63-1 (memory, storage, a volume twice) are refused naming
            the plugin and field, the node unchanged; SetNodeStatus with a TTL of 2^63-1
            seconds is refused naming ttl and the bound, not with Redis's words.
  Ids       malformed cluster and node references ('/', '..', 1 MiB) are INVALID_ARGUMENT naming
            cluster_id or node_id (not the registry's "id") with the value quoted and cut, on
            reads and on operations (DrainNode); a well-formed unknown one is still NOT_FOUND.
"""
import grpc
import json
import os
import subprocess
import tarfile
import tempfile
import unittest

import pvtest
from pb import core_pb2, core_pb2_grpc
from pivirt.cluster.v1 import cluster_pb2 as C, cluster_pb2_grpc as CG

_stack = None
INT32_MAX = 2 ** 31 - 1
INT64_MAX = 2 ** 63 - 1


def setUpModule():
    global _stack
    _stack = pvtest.Stack(gateways=1, workers=1, schedulers=1, agents=[("in1", "in")])
    _stack.start()
    path = os.path.join(_stack.data_dir, "images", "demo", "1.tar")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tempfile.TemporaryDirectory() as root:
        script = os.path.join(root, "run.sh")
        with open(script, "w") as f:
            f.write("#!/bin/sh\nsleep 30\n")
        os.chmod(script, 0o755)
        with tarfile.open(path, "w") as t:
            t.add(script, arcname="run.sh")


def tearDownModule():
    _stack.stop()


class Base(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stack = _stack
        cls.addr = _stack.gateways[0].addrs[0]
        cls.core = core_pb2_grpc.CoreRPCStub(_stack.channel(0))
        cls.cs = CG.ClusterServiceStub(_stack.channel(0))

    def eru(self, method, msg):
        t = pvtest.grpc_trailers(self.addr, "/pb.CoreRPC/" + method, msg.SerializeToString())
        return int(t.get("grpc-status", "-1")), t.get("grpc-message", "")

    def err(self, fn, req, stream=False):
        with self.assertRaises(grpc.RpcError) as e:
            r = fn(req, timeout=20)
            if stream:
                list(r)
        return e.exception.code(), e.exception.details()

    def ops_of(self, kind):
        base = self.stack.prefix + "{ops}:op:"
        return [k for k in self.stack.scan(base + "*")
                if self.stack.redis.cmd("HGET", k, "kind") == kind]


def deploy(**fields):
    o = core_pb2.DeployOptions(
        name="hostile", podname="in", image="demo:1", count=1,
        entrypoint=core_pb2.EntrypointOptions(name="web", commands=["/bin/sh", "run.sh"]),
        resources={"cpumem": json.dumps({"memory-request": "16M"}).encode()})
    for k, v in fields.items():
        target = o.entrypoint if k.startswith("entrypoint.") else o
        k = k.split(".", 1)[1] if k.startswith("entrypoint.") else k
        if k == "log_type":
            target.log.type = v
        elif k == "modes":
            for path, mode in v.items():
                target.modes[path].mode = mode
        elif isinstance(v, list):
            getattr(target, k).extend(v)
        else:
            setattr(target, k, v)
    return o


class Deploy(Base):
    BAD = (
        ({"name": "a/b"}, 'name: "a/b" must not contain \'/\''),
        ({"name": "x" * 100}, "name: "),
        ({"image": "../../etc/passwd"}, "image ../../etc/passwd: not a valid reference"),
        ({"image": "demo@sha256:00"}, "digests are not supported"),
        ({"entrypoint.name": "w b"}, 'entrypoint.name: "w b" has a character'),
        ({"entrypoint.dir": "a/../../.."}, 'entrypoint.dir: "a/../../.." must stay inside'),
        ({"entrypoint.restart": "sometimes"}, 'entrypoint.restart: "sometimes" is not a restart'),
        ({"entrypoint.publish": ["80/tcp", "0"]}, 'entrypoint.publish: "0" is not "port/proto"'),
        ({"entrypoint.log_type": "pigeon"}, 'entrypoint.log.type: "pigeon" is not a log driver'),
        ({"user": "a:b:c"}, 'user: "a:b:c" is not'),
        ({"env": ["A=1", "=2"]}, 'env: "=2" is not KEY=VALUE'),
        ({"dns": ["resolver"]}, 'dns: "resolver" is not an IPv4 or IPv6 address'),
        ({"extra_hosts": ["db"]}, 'extra_hosts: "db" is not "host:ip"'),
        ({"raw_args": b"not json"}, "raw_args: 8 bytes that are not a JSON object"),
        ({"modes": {"/conf": -1}}, 'modes["/conf"]: -1'),
        ({"modes": {"/conf": 0o10000}}, 'modes["/conf"]: 4096 (010000) is not a file mode'),
        ({"nodes_limit": -1}, "nodes_limit: -1 is negative"),
        ({"count": INT32_MAX}, "count: 2147483647 is more than one deploy may ask for"),
    )

    def usage(self):
        r = self.core.GetNodeResource(core_pb2.GetNodeResourceOptions(
            opts=core_pb2.GetNodeOptions(nodename="in1")), timeout=10)
        return r.resource_usage

    def test_a_bad_fields_fail_the_whole_call(self):
        before, creates = self.usage(), len(self.ops_of("workload.create"))
        for fields, part in self.BAD:
            code, msg = self.eru("CreateWorkload", deploy(**fields))
            self.assertEqual(code, 1074, (fields, msg))
            self.assertIn(part, msg, fields)
        # refused before anything started: no operation, nothing reserved on the node
        self.assertEqual(len(self.ops_of("workload.create")), creates)
        self.assertEqual(self.usage(), before)

    def test_b_good_values_of_the_same_fields_deploy(self):
        opts = deploy(**{"entrypoint.dir": "/", "entrypoint.restart": "no",
                         "entrypoint.publish": ["8080/tcp"], "entrypoint.log_type": "json-file",
                         "env": ["A=1", "B="], "modes": {"/conf": 0o640}, "nodes_limit": 1})
        opts.data["/conf"] = b"x"
        creates = len(self.ops_of("workload.create"))
        msgs = list(self.core.CreateWorkload(opts, timeout=60))
        self.assertEqual(len(self.ops_of("workload.create")), creates + 1)
        self.assertEqual(len(msgs), 1)
        self.assertTrue(msgs[0].success, msgs[0].error)
        got = list(self.core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(
            IDs=[msgs[0].id], force=True), timeout=60))
        self.assertTrue(got[0].success, got[0])

    def test_c_send_modes(self):
        for mode in (-1, 0o10000, 2 ** 63 - 1):
            code, msg = self.eru("Send", core_pb2.SendOptions(
                IDs=["e" * 64], data={"/f": b"x"}, modes={"/f": core_pb2.FileMode(mode=mode)}))
            self.assertEqual(code, 1062, msg)
            self.assertIn("modes: %d " % mode, msg)
            self.assertIn("is not a file mode (0 to 07777) (file /f)", msg)
        code, msg = self.eru("SendLargeFile", core_pb2.FileOptions(
            ids=["e" * 64], dst="/f", size=1, mode=core_pb2.FileMode(mode=-1), chunk=b"x"))
        self.assertEqual(code, 1063, msg)
        self.assertIn("mode: -1", msg)


def openssl(*args):
    subprocess.run(["openssl"] + list(args), check=True, capture_output=True)


class Tls(Base):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        d = tempfile.mkdtemp(prefix="pv-pem-", dir=_stack.tmpdir)
        pems = {}
        for name in ("a", "b"):
            key, crt = os.path.join(d, name + ".key"), os.path.join(d, name + ".crt")
            openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=node-" + name, "-keyout", key, "-out", crt)
            pems[name] = (open(crt).read(), open(key).read())
        enc = os.path.join(d, "enc.key")
        openssl("pkey", "-in", os.path.join(d, "a.key"), "-aes128", "-passout", "pass:secret",
                "-out", enc)
        cls.cert, cls.key = pems["a"]
        cls.other_key = pems["b"][1]
        cls.encrypted = open(enc).read()

    def test_add_node_refuses_what_is_not_pem(self):
        for fields, part in (({"ca": "hello"}, "ca: not a PEM certificate ("),
                             ({"cert": self.key}, "cert: not a PEM certificate"),
                             ({"key": self.cert}, "key: not an unencrypted PEM private key"),
                             ({"key": self.encrypted}, "key: not an unencrypted PEM private key"),
                             ({"cert": self.cert, "key": self.other_key},
                              "key: is not the private key of cert")):
            code, msg = self.eru("AddNode", core_pb2.AddNodeOptions(
                nodename="tls1", endpoint="process://", podname="in", **fields))
            self.assertEqual(code, 1031, (fields, msg))
            self.assertIn(part, msg)
            self.assertNotIn("PRIVATE KEY-----", msg)  # a key is never echoed
        code, _ = self.eru("GetNode", core_pb2.GetNodeOptions(nodename="tls1"))
        self.assertEqual(code, 1034)  # none was added

    def test_set_node_checks_pem_and_takes_good_pem(self):
        code, msg = self.eru("SetNode", core_pb2.SetNodeOptions(nodename="in1", ca="-----BEGIN "
                                                                "CERTIFICATE-----\nAAAA\n"))
        self.assertEqual(code, 1035, msg)
        self.assertIn("ca: not a PEM certificate", msg)
        code, msg = self.eru("SetNode", core_pb2.SetNodeOptions(nodename="in1", key="k"))
        self.assertEqual(code, 1035, msg)
        self.assertIn("key: not an unencrypted PEM private key", msg)
        n = self.core.SetNode(core_pb2.SetNodeOptions(nodename="in1", ca=self.cert + self.cert,
                                                      cert=self.cert, key=self.key), timeout=10)
        self.assertEqual(n.name, "in1")


class Counts(Base):
    def test_topology_counts(self):
        for topo, part in (
                (C.ClusterTopology(control_plane_count=INT32_MAX),
                 "topology.control_plane_count: 2147483647 is more nodes than a cluster may "
                 "hold (10000)"),
                (C.ClusterTopology(worker_count=10001), "topology.worker_count: 10001 is more"),
                (C.ClusterTopology(worker_count=-1), "topology.worker_count: -1 is negative")):
            code, msg = self.err(self.cs.CreateCluster, C.CreateClusterRequest(
                name="big", version="v1.0.0", topology=topo))
            self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT, msg)
            self.assertIn(part, msg)
            code, msg = self.err(self.cs.UpdateCluster, C.UpdateClusterRequest(
                cluster_id="in", topology=topo))
            self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT, msg)
            self.assertIn(part, msg)
        code, _ = self.err(self.cs.GetCluster, C.GetClusterRequest(cluster_id="big"))
        self.assertEqual(code, grpc.StatusCode.NOT_FOUND)
        made = self.cs.CreateCluster(C.CreateClusterRequest(
            name="big", version="v1.0.0", topology=C.ClusterTopology(worker_count=10000)),
            timeout=10)
        self.assertEqual(made.topology.worker_count, 10000)

    def test_upgrade_counts_bounded_by_nodes(self):
        upgrades = len(self.ops_of("cluster.upgrade"))
        for field in ("max_surge", "max_unavailable", "partition"):
            for value in (INT32_MAX, 2):
                code, msg = self.err(self.cs.UpgradeCluster, C.UpgradeClusterRequest(
                    cluster_id="in", target_version="v9.0.0",
                    strategy=C.UpgradeStrategy(**{field: value})))
                self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT, msg)
                self.assertEqual(msg, "strategy.%s: %d is more than the cluster's 1 node(s)"
                                 % (field, value))
        # partition 1 of 1 node is a count the cluster has: nothing left to upgrade
        code, msg = self.err(self.cs.UpgradeCluster, C.UpgradeClusterRequest(
            cluster_id="in", target_version="v9.0.0", strategy=C.UpgradeStrategy(partition=1)))
        self.assertEqual(code, grpc.StatusCode.FAILED_PRECONDITION, msg)
        self.assertEqual(len(self.ops_of("cluster.upgrade")), upgrades)


class Overflow(Base):
    """Sizes and TTLs near 2^63 are refused naming the field; the gateway's sanitizers (this is
    the ASan/UBSan build, and Stack.stop fails on any report) see no overflow."""

    def resources(self):
        n = self.core.GetNode(core_pb2.GetNodeOptions(nodename="in1"), timeout=10)
        return n.resource_capacity

    def test_set_node_deltas(self):
        before = self.resources()
        for doc, part in (
                ({"cpumem": {"memory": INT64_MAX}}, "cpumem: memory: "),
                ({"cpumem": {"memory": -INT64_MAX}}, "cpumem: memory: would be -"),
                ({"storage": {"storage": INT64_MAX}}, "storage: storage: "),
                ({"storage": {"volumes": ["/v:%d" % INT64_MAX, "/v:%d" % INT64_MAX]}},
                 "storage: volumes[1]: ")):
            code, msg = self.eru("SetNode", core_pb2.SetNodeOptions(
                nodename="in1", delta=True,
                resources={k: json.dumps(v).encode() for k, v in doc.items()}))
            self.assertEqual(code, 1035, (doc, msg))
            self.assertIn(part, msg)
            if "below zero" not in msg:
                self.assertIn("is outside what a size can hold", msg)
        self.assertEqual(self.resources(), before)

    def test_status_ttls(self):
        code, msg = self.eru("SetNodeStatus", core_pb2.SetNodeStatusOptions(
            nodename="in1", ttl=INT64_MAX))
        self.assertEqual(code, 1036, msg)
        self.assertEqual(msg, "ttl: 9223372036854775807 seconds is longer than a status may "
                              "live (316224000)")
        self.assertNotIn("redis", msg)


class Ids(Base):
    def test_malformed_cluster_and_node_refs(self):
        huge = "x" * (1 << 20)
        for ref, part in (("a/b", 'cluster_id: "a/b" must not contain \'/\''),
                          ("a..b", 'cluster_id: "a..b" must not contain ".."'),
                          (huge, "cluster_id: \"xxxx"),
                          ("a b", 'cluster_id: "a b" has a character other than')):
            for fn, req, stream in (
                    (self.cs.GetCluster, C.GetClusterRequest(cluster_id=ref), False),
                    (self.cs.ListNodes, C.ListNodesRequest(cluster_id=ref), True),
                    (self.cs.DrainNode, C.DrainNodeRequest(cluster_id=ref, node_id="in1"),
                     False)):
                code, msg = self.err(fn, req, stream)
                self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT, msg)
                self.assertTrue(msg.startswith(part), msg)
                self.assertLess(len(msg), 300)  # quoted and cut, never echoed whole
        code, msg = self.err(self.cs.GetCluster, C.GetClusterRequest(cluster_id=huge))
        self.assertIn("(1048576 bytes) is longer than 128 bytes", msg)
        for ref, part in (("../in1", 'node_id: "../in1" must not contain \'/\''),
                          ("x" * 200, "node_id: \"xxx")):
            for fn, req in ((self.cs.GetNode, C.GetNodeRequest(cluster_id="in", node_id=ref)),
                            (self.cs.CordonNode, C.CordonNodeRequest(cluster_id="in",
                                                                     node_id=ref))):
                code, msg = self.err(fn, req)
                self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT, msg)
                self.assertTrue(msg.startswith(part), msg)
        # well formed but unknown: still NOT_FOUND, naming the request's field; a cluster id
        # longer than a name can be is looked up, not refused
        for ref in ("nope", "cluster-" + "z" * 70):
            code, msg = self.err(self.cs.GetCluster, C.GetClusterRequest(cluster_id=ref))
            self.assertEqual(code, grpc.StatusCode.NOT_FOUND, msg)
            self.assertEqual(msg, "cluster_id: cluster %s not found" % ref)
        code, msg = self.err(self.cs.GetNode, C.GetNodeRequest(cluster_id="in", node_id="nope"))
        self.assertEqual((code, msg), (grpc.StatusCode.NOT_FOUND, "node_id: node nope not found"))


if __name__ == "__main__":
    unittest.main(verbosity=2)
