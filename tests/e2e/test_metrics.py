#!/usr/bin/python3
"""End-to-end tests of the Prometheus metrics of the gateway (gateway.metrics_listen) and of an
ops worker (worker.metrics_listen), scraped over HTTP as Prometheus would.

  gateway  grpc_server_started_total and grpc_server_handled_total move with the calls made
           (OK and NOT_FOUND told apart), grpc_server_handling_seconds is a histogram with its
           buckets, sum and count; the control plane's gauges read from Redis at the scrape:
           pivirt_redis_up, pivirt_operations{kind,status}, pivirt_queue_pending{queue},
           pivirt_queue_oldest_pending_seconds; anything but /metrics is 404.
  worker   pivirt_operation_duration_seconds{kind} and pivirt_operations_handled_total
           {kind,outcome} after test operations ran.
"""
import re
import time
import unittest
import urllib.error
import urllib.request

import grpc

import pvtest
from pivirt.operations.v1 import operations_pb2 as O, operations_pb2_grpc
from pivirt.storage.v1 import storage_pb2, storage_pb2_grpc

_stack = None
GW_PORT = pvtest.free_port()
WK_PORT = pvtest.free_port()


def setUpModule():
    global _stack
    _stack = pvtest.Stack(gateways=1, workers=1,
                          config={"gateway": {"metrics_listen": "127.0.0.1:%d" % GW_PORT},
                                  "worker": {"metrics_listen": "127.0.0.1:%d" % WK_PORT}})
    _stack.start()


def tearDownModule():
    _stack.stop()


def scrape(port, path="/metrics"):
    with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=10) as r:
        return r.headers.get("Content-Type"), r.read().decode()


def value(text, name, **labels):
    """The value of the series name{labels} (labels in any order), or None."""
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'([a-zA-Z_]+)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        if got == {k: str(v) for k, v in labels.items()}:
            return float(m.group(4))
    return None


class Metrics(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        ch = _stack.channel(0)
        cls.ops = operations_pb2_grpc.OperationServiceStub(ch)
        cls.st = storage_pb2_grpc.StorageServiceStub(ch)

    def run_ops(self, n):
        for _ in range(n):
            self.__class__.seq = getattr(self.__class__, "seq", 0) + 1
            op = self.ops.CreateTestOperation(O.CreateTestOperationRequest(
                kind="test.sleep", target="m%d" % self.seq, params={"ms": "10"}), timeout=10)
            done = self.ops.WaitOperation(O.WaitOperationRequest(id=op.id, timeout_seconds=30),
                                          timeout=35)
            self.assertEqual(done.status, O.OPERATION_STATUS_SUCCEEDED, done)

    def test_gateway(self):
        svc, m = "pivirt.operations.v1.OperationService", "CreateTestOperation"
        self.run_ops(2)
        ctype, before = scrape(GW_PORT)
        self.assertTrue(ctype.startswith("text/plain; version=0.0.4"), ctype)
        self.assertIn("# TYPE grpc_server_handled_total counter", before)
        self.assertIn("# TYPE grpc_server_handling_seconds histogram", before)
        started = value(before, "grpc_server_started_total", grpc_service=svc, grpc_method=m)
        handled = value(before, "grpc_server_handled_total", grpc_service=svc, grpc_method=m,
                        grpc_code="OK")
        self.assertGreaterEqual(started, 2)
        self.assertEqual(handled, started)
        self.run_ops(3)
        with self.assertRaises(grpc.RpcError):
            self.st.GetPool(storage_pb2.GetPoolRequest(name="nope"), timeout=10)
        # a call is counted when the gateway releases it, just after the client has its
        # answer: scrape until the last one is in
        deadline = time.monotonic() + 10
        while True:
            _, after = scrape(GW_PORT)
            if value(after, "grpc_server_handled_total",
                     grpc_service="pivirt.storage.v1.StorageService", grpc_method="GetPool",
                     grpc_code="NOT_FOUND") or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self.assertEqual(value(after, "grpc_server_started_total", grpc_service=svc,
                               grpc_method=m), started + 3)
        self.assertEqual(value(after, "grpc_server_handled_total",
                               grpc_service="pivirt.storage.v1.StorageService",
                               grpc_method="GetPool", grpc_code="NOT_FOUND"), 1)
        count = value(after, "grpc_server_handling_seconds_count", grpc_service=svc,
                      grpc_method=m)
        self.assertEqual(count, started + 3)
        self.assertEqual(value(after, "grpc_server_handling_seconds_bucket", grpc_service=svc,
                               grpc_method=m, le="+Inf"), count)
        self.assertGreater(value(after, "grpc_server_handling_seconds_sum", grpc_service=svc,
                                 grpc_method=m), 0)
        # the control plane's state, read from Redis at the scrape
        self.assertEqual(value(after, "pivirt_redis_up"), 1)
        self.assertGreaterEqual(value(after, "pivirt_operations", kind="test.sleep",
                                      status="SUCCEEDED"), 5)
        self.assertEqual(value(after, "pivirt_queue_pending", queue="ops"), 0)
        self.assertEqual(value(after, "pivirt_queue_oldest_pending_seconds"), 0)
        with self.assertRaises(urllib.error.HTTPError) as e:
            scrape(GW_PORT, "/other")
        self.assertEqual(e.exception.code, 404)

    def test_worker(self):
        self.run_ops(2)
        deadline = time.monotonic() + 10
        text = ""
        while time.monotonic() < deadline:
            _, text = scrape(WK_PORT)
            n = value(text, "pivirt_operation_duration_seconds_count", kind="test.sleep")
            if n and n >= 2:
                break
            time.sleep(0.1)
        self.assertGreaterEqual(value(text, "pivirt_operation_duration_seconds_count",
                                      kind="test.sleep"), 2)
        self.assertGreaterEqual(value(text, "pivirt_operations_handled_total", kind="test.sleep",
                                      outcome="SUCCEEDED"), 2)
        self.assertIn("# TYPE pivirt_operation_duration_seconds histogram", text)


if __name__ == "__main__":
    unittest.main(verbosity=2)
