"""Faults of the docker engine: the node agent is killed with SIGKILL in the middle of a deploy on
a docker node.

Real processes: a private dockerd (pvtest.DockerDaemon), redis-server, a gateway, a scheduler,
an ops worker and one node agent "dkf" on that daemon (unix://) with a short lease
(worker.lease_ms 1500), so the node's operation is redelivered soon after its agent dies; the
agent is started again at once.

What must hold afterwards (as e2e.test_core_deploy_faults for the process engine): the client's
one CreateWorkload call answers every instance, each once; the daemon holds exactly one running
container per instance and none other (the redelivered operation adopted what the killed agent
had made: a container created and not started, or started and not recorded); the node's usage
is what its workloads hold (GetNodeResource: no diffs); the audit (pivirt-check, which compares
the records with the daemon's containers) finds nothing, with the workloads and after their
removal, which leaves no container.
"""
import json
import threading
import time
import unittest

import pvtest
from pb import core_pb2, core_pb2_grpc

COUNT = 10
POD = "dkfp"

_env = None


def setUpModule():
    global _env
    _env = pvtest.DockerSetup(
        lambda dk: [{"node": "dkf", "pod": POD, "endpoint": dk.endpoint}],
        config={"worker": {"lease_ms": 1500, "status_interval_seconds": 1}}, alive=("dkf",))


def tearDownModule():
    if _env:
        _env.stop()


class AgentKilled(unittest.TestCase):
    def test_kill_agent_mid_create(self):
        stack, dk = _env.stack, _env.daemon
        core = core_pb2_grpc.CoreRPCStub(stack.channel(0))
        opts = core_pb2.DeployOptions(
            name="dfault", entrypoint=core_pb2.EntrypointOptions(
                name="w", commands=["/bin/sh", "-c", "sleep 300"]),
            podname=POD, image="demo:1", count=COUNT,
            resources={"cpumem": json.dumps({"memory-request": "16M"}).encode()})
        result = {}

        def deploy():
            result["msgs"] = list(core.CreateWorkload(opts, timeout=150))

        t = threading.Thread(target=deploy)
        t.start()
        deadline = time.monotonic() + 60
        made = []
        while time.monotonic() < deadline:
            made = dk.containers()
            if 2 <= len(made) < COUNT - 2:
                break
            time.sleep(0.01)
        stack.agents[0].kill9()
        killed_at = len(dk.containers())
        stack.agents[0].start()
        t.join(170)
        self.assertFalse(t.is_alive(), "CreateWorkload did not end")
        self.assertLess(killed_at, COUNT, "the kill came after the deploy ended")
        msgs = result["msgs"]
        self.assertEqual(len(msgs), COUNT, [m.error for m in msgs if not m.success])
        self.assertTrue(all(m.success for m in msgs), [m.error for m in msgs])
        ids = {m.id for m in msgs}
        self.assertEqual(len(ids), COUNT)
        # one running container per instance, nothing else
        found = dk.containers()
        by_id = {}
        for c in found:
            by_id.setdefault(c["Labels"]["pivirt.id"], []).append(c)
        self.assertEqual(sorted(by_id), sorted(ids), [c["Names"] for c in found])
        for wid, cs in by_id.items():
            self.assertEqual([c["State"] for c in cs], ["running"], (wid, cs))
        base = stack.prefix + "{reg}:"
        for wid in ids:
            self.assertEqual(stack.redis.cmd("EXISTS", base + "wl:" + wid), 1)
        res = core.GetNodeResource(core_pb2.GetNodeResourceOptions(
            opts=core_pb2.GetNodeOptions(nodename="dkf")), timeout=30)
        self.assertEqual(list(res.diffs), [])
        self.assertEqual(json.loads(res.resource_usage)["cpumem"]["memory"],
                         COUNT * 16 * 2**20)
        self.assertEqual(stack.check(), [])
        got = list(core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(IDs=sorted(ids), force=True),
                                       timeout=120))
        self.assertEqual(sum(1 for g in got if g.success), COUNT, got)
        self.assertEqual(dk.containers(), [])
        self.assertEqual(stack.check(), [])


if __name__ == "__main__":
    unittest.main(verbosity=2)
