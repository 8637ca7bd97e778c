"""Faults during CreateWorkload: the node agent is killed with SIGKILL in the middle of a deploy.

Real processes: redis-server, a gateway, a scheduler, an ops worker and one node agent (process
engine) with a short lease (worker.lease_ms 1500), so the node's operation is redelivered soon
after its agent dies. The agent is started again at once (a new consumer of the node's queue).

What must hold afterwards: the client's one CreateWorkload call still answers every instance,
each exactly once; every instance exists once (in the registry and in the engine's state); the
node's recorded usage is exactly what its workloads hold (GetNodeResource: no diffs), so nothing
was leaked or counted twice; the audit (pivirt-check) reports no difference, with the
workloads and after their removal. Instance ids derive from the reservation's allocation ids and every
step of the node's operation is journaled, which is what makes the redelivery safe.
"""
import json
import os
import tarfile
import tempfile
import threading
import time
import unittest

import pvtest
from pb import core_pb2, core_pb2_grpc

COUNT = 24


class AgentKilled(unittest.TestCase):
    def setUp(self):
        self.stack = pvtest.Stack(gateways=1, workers=1, schedulers=1, agents=[("fa", "fp")],
                                  config={"worker": {"lease_ms": 1500}})
        self.stack.start()
        path = os.path.join(self.stack.data_dir, "images", "slow", "1.tar")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with tempfile.TemporaryDirectory() as root:
            script = os.path.join(root, "run.sh")
            with open(script, "w") as f:
                f.write("#!/bin/sh\nexec sleep 120\n")
            os.chmod(script, 0o755)
            # A few megabytes, so unpacking takes a moment and the kill lands mid-deploy.
            with open(os.path.join(root, "pad.bin"), "wb") as f:
                f.write(os.urandom(4 << 20))
            with tarfile.open(path, "w") as t:
                t.add(script, arcname="run.sh")
                t.add(os.path.join(root, "pad.bin"), arcname="pad.bin")

    def tearDown(self):
        self.stack.stop(check=False)

    def test_kill_agent_mid_deploy(self):
        core = core_pb2_grpc.CoreRPCStub(self.stack.channel(0))
        opts = core_pb2.DeployOptions(
            name="fault", entrypoint=core_pb2.EntrypointOptions(name="w",
                                                                commands=["/bin/sh", "run.sh"]),
            podname="fp", image="slow:1", count=COUNT,
            resources={"cpumem": json.dumps({"memory-request": "16M"}).encode()})
        result = {}

        def deploy():
            result["msgs"] = list(core.CreateWorkload(opts, timeout=120))

        t = threading.Thread(target=deploy)
        t.start()
        engine = os.path.join(self.stack.data_dir, "engine", "fa")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            made = os.listdir(engine) if os.path.isdir(engine) else []
            if 2 <= len(made) < COUNT - 2:
                break
            time.sleep(0.01)
        agent = self.stack.agents[0]
        agent.kill9()
        killed_at = len(os.listdir(engine))
        agent.start()
        t.join(150)
        self.assertFalse(t.is_alive(), "CreateWorkload did not end")
        msgs = result["msgs"]
        self.assertLess(killed_at, COUNT, "the kill came after the deploy ended")
        self.assertEqual(len(msgs), COUNT, [m.error for m in msgs if not m.success])
        self.assertTrue(all(m.success for m in msgs), [m.error for m in msgs])
        ids = {m.id for m in msgs}
        self.assertEqual(len(ids), COUNT)
        base = self.stack.prefix + "{reg}:"
        for wid in ids:
            self.assertEqual(self.stack.redis.cmd("EXISTS", base + "wl:" + wid), 1)
        self.assertEqual(sorted(os.listdir(engine)), sorted(ids))
        res = core.GetNodeResource(core_pb2.GetNodeResourceOptions(
            opts=core_pb2.GetNodeOptions(nodename="fa")), timeout=30)
        self.assertEqual(list(res.diffs), [])
        usage = json.loads(res.resource_usage)["cpumem"]
        self.assertEqual(usage["memory"], COUNT * 16 * 2**20)
        # the audit of the whole state (records, streams, reservations, the engine's processes)
        # finds nothing the kill left behind
        self.assertEqual(self.stack.check(), [])
        self.remove_with_kill(core, ids)

    def remove_with_kill(self, core, ids):
        """The agent killed again while it removes them (the ids given twice over, as a client
        retrying inside one call might): the node's part lets the engine go of each, then gives
        all back in one step, then reports each; killed in between, its redelivery finds some
        gone from the engine but still recorded, gives those back too and tells each id once."""
        engine = os.path.join(self.stack.data_dir, "engine", "fa")
        result = {}

        def remove():
            result["got"] = list(core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(
                IDs=sorted(ids) + sorted(ids)[:3], force=True), timeout=120))

        t = threading.Thread(target=remove)
        t.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and t.is_alive():
            if 2 <= COUNT - len(os.listdir(engine)) < COUNT - 2:
                break
            time.sleep(0.005)
        self.stack.agents[0].kill9()
        left_at = len(os.listdir(engine))
        self.stack.agents[0].start()
        t.join(150)
        self.assertFalse(t.is_alive(), "RemoveWorkload did not end")
        got = result["got"]
        self.assertGreater(left_at, 0, "the kill came after the engine let them all go")
        self.assertEqual(sorted(g.id for g in got), sorted(ids), got)
        self.assertTrue(all(g.success for g in got), [g.hook for g in got if not g.success])
        base = self.stack.prefix + "{reg}:"
        for wid in ids:
            self.assertEqual(self.stack.redis.cmd("EXISTS", base + "wl:" + wid), 0)
        self.assertEqual(os.listdir(engine), [])
        res = core.GetNodeResource(core_pb2.GetNodeResourceOptions(
            opts=core_pb2.GetNodeOptions(nodename="fa")), timeout=30)
        self.assertEqual(list(res.diffs), [])
        self.assertEqual(json.loads(res.resource_usage).get("cpumem", {}).get("memory", 0), 0)
        self.assertEqual(self.stack.redis.cmd("HLEN", base + "deploy-count:fault:w"), 0)
        self.assertEqual(self.stack.check(), [])


if __name__ == "__main__":
    unittest.main(verbosity=2)
