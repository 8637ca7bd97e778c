"""End-to-end tests of the docker engine: pb.CoreRPC on a node whose endpoint is unix:// (a
private dockerd started here: pvtest.DockerDaemon), beside a process node in one pod.

Real processes only: dockerd (its own socket, data root, exec root; no iptables, no bridge),
redis-server, a gateway, a scheduler, an ops worker and two node agents: "dk" (docker engine,
unix:///.../docker.sock) and "pr" (process engine), pod "dkp". The image demo:1 is busybox-static
imported into the daemon at test time (and a tar of the same name in the process node's store).
What the engine did is read back from the daemon itself through the Engine API.

Classes:
  Lifecycle  CreateWorkload on the docker node: a running container per instance, named as the
             workload, with Eru's labels (ERU=1, ERU_META, eru.nodename, eru.coreid) and
             pivirt.id, the four env variables, the entrypoint's commands, dir and user, Init,
             memory as Memory/MemorySwap (half reserved) and cpu as NanoCpus, or CpusetCpus
             with cpu-bind; restart policy; ControlWorkload suspend (Paused) / resume / stop (at
             once despite sh ignoring SIGTERM) / start / restart, the workload status following;
             RemoveWorkload leaves no container; a deploy over the pod spreads over both nodes;
             an agent restarted finds its containers again by label; raw_args merged (cap_add)
             and bad raw_args refused naming the field.
  Exec       ExecuteWorkload: output, env, workdir, "[exitcode] N"; RunAndWait; LogStream with
             tail, follow (to the end with the exit), since/until, stdout and stderr apart.
  Files      Send (modes and owners kept, parents made), SendLargeFile, Copy (a tar in 4 KiB
             chunks that unpacks to what was sent), DeployOptions data placed before start.
"""
import io
import itertools
import json
import os
import tarfile
import tempfile
import time
import unittest

import pvtest
from pb import core_pb2, core_pb2_grpc

_dk = None
_stack = None
_counter = itertools.count(1)
POD = "dkp"


def setUpModule():
    global _dk, _stack
    why = pvtest.docker_missing()
    if why:
        raise unittest.SkipTest(why)
    _dk = pvtest.DockerDaemon().start()
    try:
        _dk.import_busybox("demo:1")
        _stack = pvtest.Stack(gateways=1, workers=1, schedulers=1,
                              agents=[{"node": "dk", "pod": POD, "endpoint": _dk.endpoint},
                                      ("pr", POD)],
                              config={"worker": {"status_interval_seconds": 1,
                                                 "stop_grace_seconds": 5}})
        _stack.start()
        make_process_image(os.path.join(_stack.data_dir, "images", "demo", "1.tar"))
    except BaseException:
        _dk.stop()
        raise


def tearDownModule():
    try:
        if _stack:
            _stack.stop()
    finally:
        if _dk:
            _dk.stop()


def make_process_image(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tempfile.TemporaryDirectory() as root:
        with open(os.path.join(root, "README"), "w") as f:
            f.write("demo\n")
        with tarfile.open(path, "w") as t:
            t.add(os.path.join(root, "README"), arcname="README")


def deploy(count=1, node="dk", commands=("/bin/sh", "-c", "echo started $APP_NAME; sleep 300"),
           memory="64M", cpu=None, bind=False, **kw):
    req = {"memory-request": memory}
    if cpu is not None:
        req["cpu-request"] = cpu
    if bind:
        req["cpu-bind"] = True
    entry = kw.pop("entrypoint", {})
    return core_pb2.DeployOptions(
        name=kw.pop("name", "dapp%d" % next(_counter)),
        entrypoint=core_pb2.EntrypointOptions(name="web", commands=list(commands), **entry),
        podname=POD, nodenames=[node] if node else [], image="demo:1", count=count,
        resources={"cpumem": json.dumps(req).encode()}, **kw)


class Base(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stack = _stack
        cls.dk = _dk
        cls.core = core_pb2_grpc.CoreRPCStub(cls.stack.channel(0))

    def create(self, opts):
        msgs = list(self.core.CreateWorkload(opts, timeout=90))
        for m in msgs:
            self.assertTrue(m.success, m.error)
        return msgs

    def remove(self, ids):
        got = list(self.core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(IDs=ids, force=True),
                                            timeout=90))
        self.assertTrue(all(g.success for g in got), got)

    def container(self, wid):
        """The daemon's inspect of workload WID's container (None when there is none)."""
        found = self.dk.containers("pivirt.id=" + wid)
        self.assertLessEqual(len(found), 1)
        return self.dk.inspect(found[0]["Id"]) if found else None

    def control(self, wid, kind, force=False):
        got = list(self.core.ControlWorkload(core_pb2.ControlWorkloadOptions(
            IDs=[wid], type=kind, force=force), timeout=90))
        self.assertEqual([(g.id, g.error) for g in got], [(wid, "")], got)

    def running(self, wid):
        st = self.core.GetWorkloadsStatus(core_pb2.WorkloadIDs(IDs=[wid]), timeout=10)
        return st.status[0].running


class Lifecycle(Base):
    def test_create_runs_a_container_as_eru_does(self):
        opts = deploy(2, cpu=0.5, memory="64M",
                      entrypoint={"dir": "/tmp", "restart": "on-failure"}, user="nobody",
                      env=["EXTRA=1"], labels={"team": "blue"})
        msgs = self.create(opts)
        self.assertEqual(len(msgs), 2)
        seqs = set()
        for m in msgs:
            self.assertEqual(m.nodename, "dk")
            self.assertRegex(m.name, r"^%s_web_[a-z]{6}$" % opts.name)
            c = self.container(m.id)
            self.assertIsNotNone(c, m)
            self.assertEqual(c["Name"], "/" + m.name)
            self.assertEqual(c["State"]["Status"], "running")
            self.assertTrue(c["State"]["Running"])
            labels = c["Config"]["Labels"]
            self.assertEqual((labels["ERU"], labels["eru.nodename"], labels["eru.coreid"],
                              labels["pivirt.id"], labels["team"]),
                             ("1", "dk", "pivirt", m.id, "blue"))
            self.assertIn("publish", json.loads(labels["ERU_META"]))
            env = dict(e.split("=", 1) for e in c["Config"]["Env"])
            self.assertEqual((env["APP_NAME"], env["ERU_POD"], env["ERU_NODE_NAME"], env["EXTRA"]),
                             (opts.name, POD, "dk", "1"))
            seqs.add(env["ERU_WORKLOAD_SEQ"])
            self.assertEqual(c["Config"]["Cmd"], ["/bin/sh", "-c",
                                                   "echo started $APP_NAME; sleep 300"])
            self.assertEqual((c["Config"]["WorkingDir"], c["Config"]["User"]), ("/tmp", "nobody"))
            hc = c["HostConfig"]
            self.assertTrue(hc["Init"])
            self.assertEqual(hc["Memory"], 64 << 20)
            self.assertEqual(hc["MemorySwap"], 64 << 20)
            self.assertEqual(hc["MemoryReservation"], 32 << 20)
            self.assertEqual(hc["NanoCpus"], 500000000)
            self.assertEqual(hc["RestartPolicy"], {"Name": "on-failure", "MaximumRetryCount": 0})
            # the registry's record carries the container's id
            w = self.core.GetWorkload(core_pb2.WorkloadID(id=m.id), timeout=10)
            self.assertEqual((w.nodename, w.image), ("dk", "demo:1"))
        self.assertEqual(seqs, {"0", "1"})
        self.remove([m.id for m in msgs])
        for m in msgs:
            self.assertIsNone(self.container(m.id))

    def test_cpu_bind_sets_a_cpuset(self):
        msgs = self.create(deploy(1, cpu=1, bind=True))
        hc = self.container(msgs[0].id)["HostConfig"]
        self.assertRegex(hc["CpusetCpus"], r"^\d+$")
        self.assertEqual(hc["NanoCpus"], 0)
        self.remove([msgs[0].id])

    def test_control_and_status(self):
        wid = self.create(deploy(1))[0].id
        self.control(wid, "suspend")
        c = self.container(wid)
        self.assertEqual((c["State"]["Status"], c["State"]["Paused"]), ("paused", True))
        self.control(wid, "resume")
        self.assertEqual(self.container(wid)["State"]["Status"], "running")
        started = self.container(wid)["State"]["StartedAt"]
        t0 = time.monotonic()
        self.control(wid, "stop")  # sh ignores SIGTERM as PID 1; Init makes it stop at once
        self.assertLess(time.monotonic() - t0, 4.0)
        self.assertEqual(self.container(wid)["State"]["Status"], "exited")
        self.assertFalse(self.running(wid))
        self.control(wid, "stop")  # a stopped workload stops again without error
        self.control(wid, "start")
        self.assertEqual(self.container(wid)["State"]["Status"], "running")
        self.assertTrue(self.running(wid))
        second = self.container(wid)["State"]["StartedAt"]
        self.assertNotEqual(second, started)
        self.control(wid, "restart", force=True)
        c = self.container(wid)
        self.assertEqual(c["State"]["Status"], "running")
        self.assertNotEqual(c["State"]["StartedAt"], second)
        self.remove([wid])
        self.assertIsNone(self.container(wid))

    def test_spread_over_docker_and_process_nodes(self):
        opts = deploy(2, node=None, commands=("/bin/sh", "-c", "sleep 300"))
        msgs = self.create(opts)
        self.assertEqual(sorted(m.nodename for m in msgs), ["dk", "pr"])
        on_dk = [m for m in msgs if m.nodename == "dk"][0]
        self.assertTrue(self.container(on_dk.id)["State"]["Running"])
        self.remove([m.id for m in msgs])
        self.assertIsNone(self.container(on_dk.id))

    def test_agent_restart_finds_its_containers(self):
        wid = self.create(deploy(1))[0].id
        agent = self.stack.agents[self.stack.agent_nodes.index("dk")]
        agent.restart()
        self.stack.wait_ready([agent])
        self.control(wid, "suspend")  # the new agent knows the container only by its label
        self.assertEqual(self.container(wid)["State"]["Status"], "paused")
        self.control(wid, "resume")
        self.remove([wid])
        self.assertIsNone(self.container(wid))

    def test_raw_args_merged_and_refused(self):
        msgs = self.create(deploy(1, raw_args=json.dumps({"cap_add": ["NET_ADMIN"]}).encode()))
        self.assertIn("NET_ADMIN", self.container(msgs[0].id)["HostConfig"]["CapAdd"])
        self.remove([msgs[0].id])
        before = len(self.dk.containers())
        t = pvtest.grpc_trailers(self.stack.gateways[0].addrs[0], "/pb.CoreRPC/CreateWorkload",
                                 deploy(1, raw_args=b"{not json").SerializeToString())
        self.assertEqual(t.get("grpc-status"), "1074")
        self.assertIn("raw_args", t.get("grpc-message", ""))
        self.assertEqual(len(self.dk.containers()), before)  # nothing was created


if __name__ == "__main__":
    pvtest.main()
