#!/usr/bin/python3
"""End-to-end test of Redis Sentinel failover: the stack's Redis is the master, a second
redis-server its replica, three sentinels (quorum 2, down after 1 s) watch them, and every
process finds the master through the sentinels (redis.sentinels, redis.master_name). The master
is killed with SIGKILL; once the sentinel has promoted the replica, operations are submitted,
run by the worker and waited on through the same gateway, without restarting anything.

Durability: with asynchronous replication a client can be told an operation was accepted that
only the master held, and a failover loses it; with redis.durability "replicated" a submit is
acknowledged only once a replica holds it (WAIT). The tests cut the replica off (stopped, its
link closed by the master), submit, kill the master and count the acknowledged operations the
promoted replica does not know.
"""
import os
import signal
import subprocess
import threading
import time
import unittest

import grpc

import pvtest
from pivirt.operations.v1 import operations_pb2 as O, operations_pb2_grpc

SENTINEL_PORTS = []
while len(SENTINEL_PORTS) < 3:  # free_port may hand the same free port out twice
    port = pvtest.free_port()
    if port not in SENTINEL_PORTS:
        SENTINEL_PORTS.append(port)
SENTINEL_PORT = SENTINEL_PORTS[0]  # the one the tests ask; all three vote


class Failover(unittest.TestCase):
    def setUp(self):
        self.stack = None
        self.procs = []

    def start(self, **redis_config):
        redis_config.update({"sentinels": ["127.0.0.1:%d" % p for p in SENTINEL_PORTS],
                             "master_name": "pvmaster"})
        self.stack = pvtest.Stack(gateways=1, workers=1, config={"redis": redis_config})
        self.stack.redis.start()
        master = self.stack.redis.port
        self.replica_dir = os.path.join(self.stack.tmpdir, "replica")
        os.makedirs(self.replica_dir)
        self.replica_port = pvtest.free_port()
        self.procs.append(subprocess.Popen(
            [pvtest.REDIS_SERVER, "--port", str(self.replica_port), "--bind", "127.0.0.1",
             "--dir", self.replica_dir, "--save", "", "--appendonly", "yes",
             "--replicaof", "127.0.0.1", str(master),
             # the master's users, so the programs log in the same way once it is promoted;
             # it replicates as the admin user
             "--aclfile", self.stack.redis.acl_path,
             "--masteruser", pvtest.REDIS_ADMIN_USER,
             "--masterauth", self.stack.redis.admin_password],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for i, port in enumerate(SENTINEL_PORTS):
            conf = os.path.join(self.stack.tmpdir, "sentinel-%d.conf" % i)
            with open(conf, "w") as f:
                f.write("port %d\nbind 127.0.0.1\nsentinel monitor pvmaster 127.0.0.1 %d 2\n"
                        "sentinel down-after-milliseconds pvmaster 1000\n"
                        "sentinel failover-timeout pvmaster 3000\n"
                        "sentinel auth-user pvmaster %s\nsentinel auth-pass pvmaster %s\n" %
                        (port, master, pvtest.REDIS_ADMIN_USER,
                         self.stack.redis.admin_password))
            self.procs.append(subprocess.Popen([pvtest.REDIS_SERVER, conf, "--sentinel"],
                                               stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL))
        self.wait_for(lambda: self.sentinel_master() == str(master))
        self.wait_for(lambda: "master_link_status:up" in self.replica_info())
        # the sentinel learns the replicas from the master's INFO (every 10 s): a failover
        # needs it to know one
        for port in SENTINEL_PORTS:
            self.wait_for(lambda: str(self.replica_port) in self.redis_cli(
                port, "SENTINEL", "replicas", "pvmaster"))
        # and each other (hello messages every 2 s): a failover needs two of the three to agree
        for port in SENTINEL_PORTS:
            self.wait_for(lambda: "num-other-sentinels\n2" in self.redis_cli(
                port, "SENTINEL", "master", "pvmaster"))
        self.stack.start()

    def tearDown(self):
        if self.stack:
            self.stack.stop()
        for p in self.procs:
            p.send_signal(signal.SIGCONT)
            p.kill()
            p.wait()

    def wait_for(self, fn, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if fn():
                    return
            except (OSError, subprocess.SubprocessError):
                pass
            time.sleep(0.2)
        self.fail("condition not met within %d s" % timeout)

    def redis_cli(self, port, *args):
        auth = [] if port in SENTINEL_PORTS else self.stack.redis.cli_auth_args()
        return subprocess.run(["redis-cli", "-p", str(port)] + auth + list(args),
                              capture_output=True, text=True, timeout=5).stdout

    def sentinel_master(self):
        out = self.redis_cli(SENTINEL_PORT, "SENTINEL", "get-master-addr-by-name", "pvmaster")
        lines = out.split()
        return lines[1] if len(lines) == 2 else None

    def replica_info(self):
        return self.redis_cli(self.replica_port, "INFO", "replication")

    def run_op(self, ops, target, timeout=30):
        """Submits a test operation and waits for it, retrying while Redis is failing over."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                op = ops.CreateTestOperation(O.CreateTestOperationRequest(
                    kind="test.sleep", target=target, params={"ms": "10"}), timeout=5)
                return ops.WaitOperation(O.WaitOperationRequest(id=op.id, timeout_seconds=20),
                                         timeout=25)
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
                time.sleep(0.3)

    def test_failover_keeps_the_control_plane_working(self):
        self.start()
        ops = operations_pb2_grpc.OperationServiceStub(self.stack.channel(0))
        before = self.run_op(ops, "before")
        self.assertEqual(before.status, O.OPERATION_STATUS_SUCCEEDED, before)
        self.stack.redis.kill9()
        self.wait_for(lambda: self.sentinel_master() == str(self.replica_port))
        self.wait_for(lambda: "role:master" in self.replica_info())
        after = self.run_op(ops, "after")
        self.assertEqual(after.status, O.OPERATION_STATUS_SUCCEEDED, after)
        # the new master holds the operations, the one from before the failover too
        got = ops.GetOperation(O.GetOperationRequest(id=before.id), timeout=10)
        self.assertEqual(got.status, O.OPERATION_STATUS_SUCCEEDED)
        self.assertTrue(all(p.alive() for p in self.stack.procs))

    def test_master_killed_under_load_replicated_loses_nothing(self):
        # four clients submit and wait on operations without pause while the master is
        # SIGKILLed; with "replicated" durability no acknowledged operation may be missing
        # from the promoted replica
        self.start(durability="replicated", wait_replicas=1, wait_timeout_ms=500)
        ops = operations_pb2_grpc.OperationServiceStub(self.stack.channel(0))
        acked, refused, stop = [], [], threading.Event()
        lock = threading.Lock()

        def client(n):
            i = 0
            while not stop.is_set():
                i += 1
                try:
                    op = ops.CreateTestOperation(O.CreateTestOperationRequest(
                        kind="test.sleep", target="load-%d-%d" % (n, i), params={"ms": "1"}),
                        timeout=5)
                    with lock:
                        acked.append(op.id)
                except grpc.RpcError as e:
                    with lock:
                        refused.append(e.code())
                    time.sleep(0.05)

        threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        try:
            time.sleep(2)
            before_kill = len(acked)
            self.stack.redis.kill9()
            self.wait_for(lambda: self.sentinel_master() == str(self.replica_port))
            self.wait_for(lambda: "role:master" in self.replica_info())
            # the old master returns as the new one's replica: submissions are confirmed again
            self.stack.redis.start()
            self.stack.redis.cmd("CONFIG", "SET", "masteruser", pvtest.REDIS_ADMIN_USER)
            self.stack.redis.cmd("CONFIG", "SET", "masterauth", self.stack.redis.admin_password)
            n = len(acked)
            self.wait_for(lambda: len(acked) > n + 20, timeout=60)
        finally:
            stop.set()
            for t in threads:
                t.join(30)
        lost = self.count_lost(ops, acked)
        print("master killed under load (4 clients), durability replicated: %d acknowledged "
              "(%d before the kill), %d lost, %d refused or unavailable meanwhile" %
              (len(acked), before_kill, lost, len(refused)))
        self.assertGreater(before_kill, 0)
        self.assertEqual(lost, 0)
        self.assertTrue(all(p.alive() for p in self.stack.procs))

    def count_lost(self, ops, acked):
        """How many of the acknowledged operations the (new) master does not know."""
        lost = 0
        for op_id in acked:
            try:
                ops.GetOperation(O.GetOperationRequest(id=op_id), timeout=10)
            except grpc.RpcError as e:
                self.assertEqual(e.code(), grpc.StatusCode.NOT_FOUND, e.details())
                lost += 1
        return lost

    def submit(self, ops, n, tag, acked, refused):
        for i in range(n):
            try:
                op = ops.CreateTestOperation(O.CreateTestOperationRequest(
                    kind="test.sleep", target="%s-%d" % (tag, i), params={"ms": "1"}), timeout=5)
                acked.append(op.id)
            except grpc.RpcError as e:
                refused.append((e.code(), e.details()))

    def lose_the_master_while_the_replica_lags(self, window):
        """Submits 10 operations, cuts the replica off, submits `window` more, kills the master,
        lets the replica be promoted and submits 10 more. Returns (acked, refused, lost)."""
        ops = operations_pb2_grpc.OperationServiceStub(self.stack.channel(0))
        acked, refused = [], []
        self.submit(ops, 10, "before", acked, refused)
        self.assertEqual(refused, [])
        replica = self.procs[0]
        replica.send_signal(signal.SIGSTOP)
        # the master closes the link: what it accepts from now on stays in its own memory
        self.redis_cli(self.stack.redis.port, "CLIENT", "KILL", "TYPE", "replica")
        self.submit(ops, window, "window", acked, refused)
        self.stack.redis.kill9()
        replica.send_signal(signal.SIGCONT)
        self.wait_for(lambda: self.sentinel_master() == str(self.replica_port))
        self.wait_for(lambda: "role:master" in self.replica_info())
        # the old master comes back; the sentinel makes it the new master's replica (with
        # "replicated" durability nothing is acknowledged until some replica confirms)
        self.stack.redis.start()
        # it replicates as the admin user, as the first replica did
        self.stack.redis.cmd("CONFIG", "SET", "masteruser", pvtest.REDIS_ADMIN_USER)
        self.stack.redis.cmd("CONFIG", "SET", "masterauth", self.stack.redis.admin_password)
        deadline = time.monotonic() + 60
        after = []
        while len(after) < 10 and time.monotonic() < deadline:
            self.submit(ops, 1, "after%d" % len(after), after, [])
            time.sleep(0.05 if after else 0.3)
        self.assertEqual(len(after), 10, "the control plane did not come back")
        acked += after
        lost = self.count_lost(ops, acked)
        return acked, refused, lost

    def test_asynchronous_replication_loses_what_the_replica_never_got(self):
        self.start(durability="async")
        acked, refused, lost = self.lose_the_master_while_the_replica_lags(window=8)
        print("durability async: %d operations acknowledged, %d lost in the failover, %d "
              "refused" % (len(acked), lost, len(refused)))
        self.assertEqual(refused, [])
        self.assertEqual(lost, 8)

    def test_replicated_durability_loses_no_acknowledged_operation(self):
        self.start(durability="replicated", wait_replicas=1, wait_timeout_ms=300)
        acked, refused, lost = self.lose_the_master_while_the_replica_lags(window=8)
        print("durability replicated: %d operations acknowledged, %d lost in the failover, %d "
              "refused while no replica confirmed" % (len(acked), lost, len(refused)))
        self.assertEqual(lost, 0)
        self.assertEqual(len(acked), 20)
        self.assertEqual(len(refused), 8)
        for code, details in refused:
            self.assertEqual(code, grpc.StatusCode.UNAVAILABLE)
            self.assertIn("0 of 1 replica(s) within 300 ms", details)
            self.assertIn("redis.durability replicated", details)


if __name__ == "__main__":
    unittest.main(verbosity=2)
