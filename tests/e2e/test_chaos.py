#!/usr/bin/python3
"""Chaos: processes killed with SIGKILL in the middle of their work, under a real stack.

- A gateway dies while it streams a CreateWorkload to its client. The deploy is an operation in
  Redis, so it goes on without the gateway; the client retries the same call with the same
  x-request-id on another gateway and is answered every instance, once each, by the operation
  that already runs (nothing is deployed twice).
- Schedulers are killed again and again while concurrent deploys ask them for reservations. A
  plan request a dead scheduler held is taken over by the other after scheduler.claim_idle_ms;
  a reservation's id derives from its request, so one committed just before the kill is found,
  not made twice. Every deploy succeeds and each node's recorded usage is exactly what its
  workloads hold (GetNodeResource reports no difference).
Both end with the audit (pivirt-check): no difference between records, streams, reservations
and what the engines run.
"""
import json
import os
import random
import tarfile
import tempfile
import threading
import time
import unittest

import grpc

import pvtest
from pb import core_pb2, core_pb2_grpc


def make_image(data_dir, name, pad_bytes=0):
    """A process-engine image NAME:1 whose entrypoint sleeps; PAD_BYTES of random data make its
    unpacking take a moment."""
    path = os.path.join(data_dir, "images", name, "1.tar")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tempfile.TemporaryDirectory() as root:
        script = os.path.join(root, "run.sh")
        with open(script, "w") as f:
            f.write("#!/bin/sh\nexec sleep 120\n")
        os.chmod(script, 0o755)
        with tarfile.open(path, "w") as t:
            t.add(script, arcname="run.sh")
            if pad_bytes:
                pad = os.path.join(root, "pad.bin")
                with open(pad, "wb") as f:
                    f.write(os.urandom(pad_bytes))
                t.add(pad, arcname="pad.bin")


def deploy_opts(name, pod, image, count, memory="16M"):
    return core_pb2.DeployOptions(
        name=name, entrypoint=core_pb2.EntrypointOptions(name="w", commands=["/bin/sh", "run.sh"]),
        podname=pod, image=image, count=count,
        resources={"cpumem": json.dumps({"memory-request": memory}).encode()})


class Chaos(unittest.TestCase):
    def tearDown(self):
        self.stack.stop(check=False)

    def assert_usage_is_exact(self, core, nodes):
        for node in nodes:
            res = core.GetNodeResource(core_pb2.GetNodeResourceOptions(
                opts=core_pb2.GetNodeOptions(nodename=node)), timeout=30)
            self.assertEqual(list(res.diffs), [], node)

    def registered(self):
        return self.stack.redis.cmd("SCAN", "0", "MATCH", self.stack.prefix + "{reg}:wl:*",
                                    "COUNT", "100000")[1]

    def test_gateway_killed_mid_stream(self):
        count = 12
        self.stack = pvtest.Stack(gateways=2, workers=1, schedulers=1, agents=[("ga", "gp")])
        self.stack.start()
        make_image(self.stack.data_dir, "slow", pad_bytes=4 << 20)
        first = core_pb2_grpc.CoreRPCStub(self.stack.channel(0))
        md = (("x-request-id", "chaos-gateway-1"),)
        opts = deploy_opts("gwchaos", "gp", "slow:1", count)
        got_before = []
        stream = first.CreateWorkload(opts, timeout=120, metadata=md)
        with self.assertRaises(grpc.RpcError) as cut:
            for msg in stream:
                got_before.append(msg)
                if len(got_before) == 2:
                    self.stack.gateways[0].proc.kill9()
        self.assertEqual(cut.exception.code(), grpc.StatusCode.UNAVAILABLE)
        self.assertLess(len(got_before), count, "the kill came after the deploy ended")

        # the retry, on the other gateway, with the same request id
        second = core_pb2_grpc.CoreRPCStub(self.stack.channel(1))
        msgs = list(second.CreateWorkload(opts, timeout=120, metadata=md))
        self.assertEqual(len(msgs), count, [m.error for m in msgs if not m.success])
        self.assertTrue(all(m.success for m in msgs), [m.error for m in msgs])
        ids = {m.id for m in msgs}
        self.assertEqual(len(ids), count)
        self.assertTrue({m.id for m in got_before} <= ids)
        engine = os.path.join(self.stack.data_dir, "engine", "ga")
        self.assertEqual(sorted(os.listdir(engine)), sorted(ids))
        self.assertEqual(len(self.registered()), count)
        # one deploy operation for both calls
        ops = [k for k in self.stack.redis.cmd("SCAN", "0", "MATCH", self.stack.prefix + "{ops}:op:*", "COUNT", "100000")[1]
               if self.stack.redis.cmd("HGET", k, "kind") == "workload.create"]
        self.assertEqual(len(ops), 1, ops)
        self.assert_usage_is_exact(second, ["ga"])
        self.assertEqual(self.stack.check(), [])

    def test_schedulers_killed_during_reservations(self):
        clients, deploys, per = 4, 10, 2
        self.stack = pvtest.Stack(gateways=1, workers=2, schedulers=2,
                                  agents=[("sa", "sp"), ("sb", "sp")],
                                  config={"scheduler": {"claim_idle_ms": 500}})
        self.stack.start()
        make_image(self.stack.data_dir, "quick")
        core = core_pb2_grpc.CoreRPCStub(self.stack.channel(0))
        results, errors = [], []
        done = threading.Event()

        def client(c):
            for d in range(deploys):
                try:
                    msgs = list(core.CreateWorkload(
                        deploy_opts("sch%d" % c, "sp", "quick:1", per), timeout=120,
                        metadata=(("x-request-id", "chaos-sched-%d-%d" % (c, d)),)))
                    results.extend(msgs)
                except grpc.RpcError as e:
                    errors.append((e.code(), e.details()))

        threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
        for t in threads:
            t.start()

        kills = 0
        rnd = random.Random(7)

        def chaos():
            nonlocal kills
            while not done.is_set():
                victim = self.stack.schedulers[rnd.randrange(2)]
                time.sleep(rnd.uniform(0.02, 0.2))
                victim.kill9()
                kills += 1
                victim.start()
                self.stack.wait_ready([victim])

        # the kills and restarts run on this thread: a process the harness starts dies with the
        # thread that started it (PR_SET_PDEATHSIG follows the thread)
        waiter = threading.Thread(target=lambda: ([t.join(240) for t in threads], done.set()))
        waiter.start()
        chaos()
        waiter.join()
        self.assertFalse(any(t.is_alive() for t in threads), "a deploy did not end")
        print("schedulers SIGKILLed %d times during %d deploys" % (kills, clients * deploys))
        self.assertGreater(kills, 0)
        self.assertEqual(errors, [])
        self.assertEqual(len(results), clients * deploys * per,
                         [m.error for m in results if not m.success])
        self.assertTrue(all(m.success for m in results), [m.error for m in results])
        self.assertEqual(len({m.id for m in results}), clients * deploys * per)
        self.assertEqual(len(self.registered()), clients * deploys * per)
        self.assert_usage_is_exact(core, ["sa", "sb"])
        self.assertEqual(self.stack.check(), [])


if __name__ == "__main__":
    unittest.main(verbosity=2)
