"""End-to-end tests of the docker engine on tcp:// with TLS, and of a daemon that does not
answer.

A private dockerd listens on its socket and on tcp://127.0.0.1:PORT with --tlsverify (a CA of
the test's own signed its certificate and the client's: pvtest.DockerDaemon(tls=True)). Node
"dkt" reaches it over TCP with the client's CA, certificate and key (its agent's
worker.tls_ca/cert/key); node "dkn" too, but its agent has no worker.tls_*: it takes them from
the node's record (AddNode's ca, cert, key); node "dkx" names a socket where no daemon listens.
All in pod "tcp", with a process node "tpr".

Classes:
  Tls          a workload on dkt runs in the daemon (seen through its socket), labelled with its
               node; exec works over TLS; the node's engine info says docker, and its
               cpu_count/mem_total (what the scheduler sees) are the daemon's GET /info NCPU and
               MemTotal (the daemon runs on one core: taskset), as are the resources its agent
               registered it with.
  Unreachable  dkx is NOT_READY (its alive key never set) while its agent runs, its log naming
               the daemon's address; a deploy that names it fails its instance at once with
               the address.
  NodeTls      dkn added with AddNode's ca, cert and key: its agent reaches the TLS daemon with
               them (alive, a workload runs there); they are never answered (AddNode, GetNode)
               nor logged; SetNode with another CA: the node goes NOT_READY, its agent's log and
               a control of its workload naming the daemon's address; the right CA back, it is
               alive again.
  DaemonDown   the daemon stops under dkt: the node goes NOT_READY within a few beats, a
               control of its workload fails fast naming tcp://127.0.0.1:PORT, nothing of the
               record is lost; the daemon back, the node is alive again and the workload starts.
"""
import json
import os
import subprocess
import tempfile
import time
import unittest

import grpc

import pvtest
from pb import core_pb2, core_pb2_grpc

_env = None
_dk = _stack = None
POD = "tcp"
NOWHERE = "unix:///tmp/pvdk-none/docker.sock"


def setUpModule():
    global _env, _dk, _stack
    # ready = presence: dkx's agent runs while its node is not alive
    _env = pvtest.DockerSetup(
        lambda dk: [{"node": "dkt", "pod": POD, "endpoint": dk.tcp_endpoint,
                     "set": {"worker.tls_ca": dk.ca_pem, "worker.tls_cert": dk.cert_pem,
                             "worker.tls_key": dk.key_pem}},
                    # registers nothing (worker.pod ""): AddNode adds it with its certificates
                    {"node": "dkn", "pod": "", "endpoint": dk.tcp_endpoint},
                    {"node": "dkx", "pod": POD, "endpoint": NOWHERE}, ("tpr", POD)],
        config={"worker": {"status_interval_seconds": 1, "heartbeat_seconds": 1}},
        tls=True, daemon_cpus="0")
    _dk, _stack = _env.daemon, _env.stack


def tearDownModule():
    if _env:
        _env.stop()


def deploy(node, count=1):
    return core_pb2.DeployOptions(
        name="tapp%d" % int(time.monotonic() * 1000 % 1000000),
        entrypoint=core_pb2.EntrypointOptions(name="web", commands=["/bin/sh", "-c",
                                                                    "sleep 300"]),
        podname=POD, nodenames=[node], image="demo:1", count=count,
        resources={"cpumem": json.dumps({"memory-request": "32M"}).encode()})


class Base(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stack = _stack
        cls.core = core_pb2_grpc.CoreRPCStub(cls.stack.channel(0))

    def alive(self, node):
        """GetNodeStatus's alive; False when the node's status key is gone (Eru answers
        "not found" then)."""
        try:
            return self.core.GetNodeStatus(core_pb2.GetNodeStatusOptions(nodename=node),
                                           timeout=10).alive
        except grpc.RpcError as e:
            if "not found" not in (e.details() or ""):
                raise
            return False

    def container(self, wid):
        found = _dk.containers("pivirt.id=" + wid)
        return _dk.inspect(found[0]["Id"]) if found else None


class Tls(Base):
    def test_workload_over_tls(self):
        msgs = list(self.core.CreateWorkload(deploy("dkt"), timeout=90))
        self.assertTrue(msgs[0].success, msgs[0].error)
        c = self.container(msgs[0].id)
        self.assertTrue(c["State"]["Running"])
        self.assertEqual(c["Config"]["Labels"]["eru.nodename"], "dkt")
        req = core_pb2.ExecuteWorkloadOptions(workload_id=msgs[0].id,
                                              commands=["/bin/echo", "over tls"])
        got = [m.data for m in self.core.ExecuteWorkload(iter([req]), timeout=60)]
        self.assertEqual(got, [b"over tls\n", b"[exitcode] 0"])
        eng = self.core.GetNodeEngineInfo(core_pb2.GetNodeOptions(nodename="dkt"), timeout=10)
        self.assertEqual(eng.type, "docker")
        list(self.core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(IDs=[msgs[0].id],
                                                                     force=True), timeout=60))
        self.assertIsNone(self.container(msgs[0].id))


    def test_engine_info_is_the_daemons(self):
        # the daemon runs on core 0 alone: its NCPU is 1, whatever the agent's machine has
        daemon = _dk.api("GET", "/info")
        self.assertEqual(daemon["NCPU"], 1)
        node = self.core.GetNode(core_pb2.GetNodeOptions(nodename="dkt"), timeout=10)
        info = json.loads(node.info)
        self.assertEqual((info["cpu_count"], info["mem_total"]), (1, daemon["MemTotal"]))
        if (os.cpu_count() or 1) > 1:
            self.assertEqual(info["machine"]["mem_total"], daemon["MemTotal"])  # same machine
            self.assertNotEqual(info["cpu_count"], os.cpu_count())
        # the node its agent registered: one core's worth, as the scheduler sees it
        self.assertEqual(json.loads(node.resource_capacity)["cpumem"]["cpu"], 1)


class Unreachable(Base):
    def test_node_not_ready_naming_the_address(self):
        agent = self.stack.agents[self.stack.agent_nodes.index("dkx")]
        self.assertTrue(agent.alive())
        deadline = time.monotonic() + 10
        while "not ready" not in agent.log() and time.monotonic() < deadline:
            time.sleep(0.1)
        line = next(l for l in agent.log().splitlines() if "not ready" in l)
        self.assertIn(NOWHERE, line)
        self.assertFalse(self.alive("dkx"))
        self.assertTrue(self.alive("dkt"))
        # a deploy that names it (Eru lets a named node through) fails fast with the address
        t0 = time.monotonic()
        got = list(self.core.CreateWorkload(deploy("dkx"), timeout=60))
        self.assertLess(time.monotonic() - t0, 5)
        self.assertEqual([m.success for m in got], [False])
        self.assertIn(NOWHERE, got[0].error)
        self.assertEqual(_dk.containers("eru.nodename=dkx"), [])


def read(path):
    with open(path) as f:
        return f.read()


class NodeTls(Base):
    def wait_alive(self, node, want, within=15):
        deadline = time.monotonic() + within
        while self.alive(node) != want:
            self.assertLess(time.monotonic(), deadline, "%s: alive is not %s" % (node, want))
            time.sleep(0.2)

    def test_node_certificates_from_add_node(self):
        ca, cert, key = read(_dk.ca_pem), read(_dk.cert_pem), read(_dk.key_pem)
        node = self.core.AddNode(core_pb2.AddNodeOptions(
            nodename="dkn", endpoint=_dk.tcp_endpoint, podname=POD, ca=ca, cert=cert, key=key,
            resources={"cpumem": json.dumps({"cpu": 2, "memory": "1G"}).encode()}), timeout=10)
        self.wait_alive("dkn", True)
        msgs = list(self.core.CreateWorkload(deploy("dkn"), timeout=90))
        self.assertTrue(msgs[0].success, msgs[0].error)
        wid = msgs[0].id
        self.addCleanup(lambda: list(self.core.RemoveWorkload(
            core_pb2.RemoveWorkloadOptions(IDs=[wid], force=True), timeout=60)))
        c = self.container(wid)
        self.assertTrue(c["State"]["Running"])
        self.assertEqual(c["Config"]["Labels"]["eru.nodename"], "dkn")
        # secrets: in no answer, in no log
        got = self.core.GetNode(core_pb2.GetNodeOptions(nodename="dkn"), timeout=10)
        body = cert.splitlines()[1]  # a line of the certificate's base64
        for answer in (node, got):
            text = answer.SerializeToString()
            self.assertNotIn(b"BEGIN", text)
            self.assertNotIn(body.encode(), text)
        agent = self.stack.agents[self.stack.agent_nodes.index("dkn")]
        for p in self.stack.procs:
            self.assertNotIn("PRIVATE KEY", p.log(), p.name)
            self.assertNotIn(body, p.log(), p.name)
        self.assertIn("engine TLS from the node's record: its CA, certificate and key",
                      agent.log())
        # another CA: the daemon's certificate no longer checks out
        with tempfile.TemporaryDirectory() as d:
            subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                            "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj",
                            "/CN=other-ca", "-keyout", d + "/k.pem", "-out", d + "/ca.pem"],
                           check=True, capture_output=True)
            wrong = read(d + "/ca.pem")
        self.core.SetNode(core_pb2.SetNodeOptions(nodename="dkn", ca=wrong), timeout=10)
        self.wait_alive("dkn", False)
        line = [l for l in agent.log().splitlines() if "not ready" in l][-1]
        self.assertIn(_dk.tcp_endpoint, line)
        got = list(self.core.ControlWorkload(core_pb2.ControlWorkloadOptions(
            IDs=[wid], type="stop"), timeout=60))
        self.assertIn(_dk.tcp_endpoint, got[0].error)
        self.assertTrue(self.container(wid)["State"]["Running"])
        # the right one back
        self.core.SetNode(core_pb2.SetNodeOptions(nodename="dkn", ca=ca), timeout=10)
        self.wait_alive("dkn", True)


class DaemonDown(Base):
    def test_daemon_stops_under_the_agent(self):
        wid = list(self.core.CreateWorkload(deploy("dkt"), timeout=90))[0].id
        _dk.proc.stop(timeout=30)
        try:
            deadline = time.monotonic() + 15
            while self.alive("dkt") and time.monotonic() < deadline:
                time.sleep(0.2)
            self.assertFalse(self.alive("dkt"))
            t0 = time.monotonic()
            got = list(self.core.ControlWorkload(core_pb2.ControlWorkloadOptions(
                IDs=[wid], type="stop"), timeout=60))
            self.assertLess(time.monotonic() - t0, 8)
            self.assertEqual(len(got), 1)
            self.assertIn(_dk.tcp_endpoint, got[0].error)
            # nothing is lost: the record stays
            w = self.core.GetWorkload(core_pb2.WorkloadID(id=wid), timeout=10)
            self.assertEqual(w.nodename, "dkt")
        finally:
            _dk.start()
        deadline = time.monotonic() + 15
        while not self.alive("dkt") and time.monotonic() < deadline:
            time.sleep(0.2)
        self.assertTrue(self.alive("dkt"))
        got = list(self.core.ControlWorkload(core_pb2.ControlWorkloadOptions(
            IDs=[wid], type="start"), timeout=60))
        self.assertEqual([g.error for g in got], [""])
        self.assertTrue(self.container(wid)["State"]["Running"])
        list(self.core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(IDs=[wid], force=True),
                                      timeout=60))


if __name__ == "__main__":
    pvtest.main()
