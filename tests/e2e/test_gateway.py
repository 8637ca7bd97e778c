"""End-to-end tests of the gateway foundation through real gRPC clients.

Debian's python3-grpcio with stubs generated from proto/ (build/py), and `buf curl`, which
knows nothing but what our reflection tells it. Every test runs against real processes: a
redis-server and one or more pivirt-gateway binaries (sanitizer builds under ./ops/pivirt test;
the harness fails a test whose process logs a sanitizer report or a leak).
"""
import hashlib
import json
import os
import signal
import subprocess
import time
import unittest

import grpc

import pvtest
from pb import core_pb2, core_pb2_grpc
from pivirt.storage.v1 import storage_pb2, storage_pb2_grpc

SERVICES = [
    "pb.CoreRPC",
    "pivirt.cluster.v1.ClusterService",
    "pivirt.storage.v1.StorageService",
    "pivirt.operations.v1.OperationService",
    "grpc.health.v1.Health",
]

# grpc.health.v1 messages by hand: two tiny messages, no generated module needed (generating
# health_pb2 creates a package named grpc that shadows the real one).
SERVING, NOT_SERVING, SERVICE_UNKNOWN = 1, 2, 3


def health_request(service):
    data = service.encode()
    return (b"\x0a" + bytes([len(data)]) + data) if data else b""


def health_status(raw):
    return raw[1] if len(raw) >= 2 and raw[0] == 0x08 else 0


def check(channel, service="", metadata=None, timeout=5):
    call = channel.unary_unary("/grpc.health.v1.Health/Check")
    return health_status(call(health_request(service), metadata=metadata, timeout=timeout))


grpc_trailers = pvtest.grpc_trailers


def raw_unary(channel, path, payload, metadata=None, timeout=5):
    return channel.unary_unary(path)(payload, metadata=metadata, timeout=timeout)


class GatewayBasics(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stack = pvtest.Stack(gateways=1, config={"gateway": {"max_request_bytes": 524288}})
        cls.stack.start()
        cls.ch = cls.stack.channel(0)

    @classmethod
    def tearDownClass(cls):
        cls.ch.close()
        cls.stack.stop()

    def test_health_serving_for_server_and_each_service(self):
        self.assertEqual(check(self.ch, ""), SERVING)
        for s in SERVICES:
            self.assertEqual(check(self.ch, s), SERVING, s)

    def test_health_unknown_service_is_not_found(self):
        with self.assertRaises(grpc.RpcError) as e:
            check(self.ch, "no.such.Service")
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
        self.assertIn("no.such.Service", e.exception.details())

    def test_every_listen_address_serves(self):
        addrs = self.stack.gateways[0].addrs
        self.assertGreaterEqual(len(addrs), 2)
        for a in addrs:
            with grpc.insecure_channel(a) as ch:
                self.assertEqual(check(ch), SERVING, a)

    def test_info_reports_build_and_identifier(self):
        info = core_pb2_grpc.CoreRPCStub(self.ch).Info(core_pb2.Empty(), timeout=5)
        self.assertRegex(info.version, r"^\d+\.\d+\.\d+$")
        self.assertTrue(info.revison)
        self.assertTrue(info.build_at)
        self.assertIn("gcc", info.golang_version)
        self.assertRegex(info.os_arch, r"^linux/")
        cfg = self.stack.config
        store = "store=redis\nredis.addr=%s\nredis.db=%d\nredis.prefix=%s\n" % (
            cfg["redis"]["addr"], cfg["redis"].get("db", 0), cfg["redis"]["prefix"])
        self.assertEqual(info.identifier, hashlib.sha256(store.encode()).hexdigest())

    def test_every_service_is_served(self):
        # every API is built now: a declared call reaches its handler (here: NOT_FOUND)
        stub = storage_pb2_grpc.StorageServiceStub(self.ch)
        with self.assertRaises(grpc.RpcError) as e:
            stub.GetPool(storage_pb2.GetPoolRequest(name="x"), timeout=5)
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
        self.assertIn("pool x not found", e.exception.details())

    def test_unknown_method_is_unimplemented_at_once(self):
        t0 = time.monotonic()
        with self.assertRaises(grpc.RpcError) as e:
            raw_unary(self.ch, "/no.such.Service/Nothing", b"", timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.UNIMPLEMENTED)
        self.assertIn("unknown method /no.such.Service/Nothing", e.exception.details())
        self.assertLess(time.monotonic() - t0, 5)

    def test_malformed_protobuf_is_invalid_argument(self):
        with self.assertRaises(grpc.RpcError) as e:
            raw_unary(self.ch, "/pb.CoreRPC/Info", b"\xff\xff\xff")
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("cannot decode pb.Empty", e.exception.details())

    def test_missing_request_message_is_invalid_argument(self):
        # A client stream with no message on a unary method: the server gets no request body.
        call = self.ch.stream_unary("/pb.CoreRPC/Info")
        with self.assertRaises(grpc.RpcError) as e:
            call(iter([]), timeout=5)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("missing pb.Empty", e.exception.details())

    def test_oversized_request_is_resource_exhausted_naming_the_limit(self):
        big = b"\x0a\x80\x80\x40" + b"a" * (1 << 20)  # field 1, 1 MiB, over the 512 KiB limit
        with self.assertRaises(grpc.RpcError) as e:
            raw_unary(self.ch, "/grpc.health.v1.Health/Check", big)
        self.assertEqual(e.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertIn("gateway.max_request_bytes", e.exception.details())

    def test_eru_method_bad_request_carries_eru_code(self):
        # Eru's per-call codes (1001 for WatchServiceStatus) are not canonical gRPC codes.
        # Go clients read them as they are; python's grpcio hangs on them, so this test reads
        # the HTTP/2 trailers with nghttp.
        trailers = grpc_trailers(self.stack.gateways[0].addrs[0],
                                 "/pb.CoreRPC/WatchServiceStatus", b"\xff\xff")
        self.assertEqual(trailers.get("grpc-status"), "1001")
        self.assertIn("cannot decode pb.Empty", trailers.get("grpc-message", ""))

    def test_unknown_enum_value_is_invalid_argument_naming_the_field(self):
        # ListOperationsRequest.status (field 3) = 99: not a value of OperationStatus.
        call = self.ch.unary_stream("/pivirt.operations.v1.OperationService/ListOperations")
        with self.assertRaises(grpc.RpcError) as e:
            list(call(b"\x18\x63", timeout=5))
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("status", e.exception.details())
        self.assertIn("99", e.exception.details())
        self.assertIn("pivirt.operations.v1.OperationStatus", e.exception.details())

    def test_concurrent_calls_all_answer(self):
        stub = core_pb2_grpc.CoreRPCStub(self.ch)
        futures = [stub.Info.future(core_pb2.Empty(), timeout=10) for _ in range(300)]
        ids = {f.result().identifier for f in futures}
        self.assertEqual(len(ids), 1)


class Reflection(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stack = pvtest.Stack(gateways=1)
        cls.stack.start()
        cls.url = "http://" + cls.stack.gateways[0].addrs[0]

    @classmethod
    def tearDownClass(cls):
        cls.stack.stop()

    def buf(self, *args):
        return pvtest.buf_curl("--protocol", "grpc", "--http2-prior-knowledge", *args,
                               check=False)

    def test_list_services_v1_and_v1alpha(self):
        for proto in ("grpc-v1", "grpc-v1alpha"):
            rc, out, err = self.buf("--reflect-protocol", proto, "--list-services", self.url)
            self.assertEqual(rc, 0, err)
            listed = set(out.split())
            for s in SERVICES + ["grpc.reflection.v1.ServerReflection",
                                 "grpc.reflection.v1alpha.ServerReflection"]:
                self.assertIn(s, listed, proto)

    def test_list_methods_of_each_api(self):
        rc, out, err = self.buf("--list-methods", self.url)
        self.assertEqual(rc, 0, err)
        per_service = {}
        for m in out.split():
            per_service.setdefault(m.split("/")[0], []).append(m)
        self.assertEqual(len(per_service["pb.CoreRPC"]), 45)
        self.assertEqual(len(per_service["pivirt.cluster.v1.ClusterService"]), 16)
        self.assertEqual(len(per_service["pivirt.storage.v1.StorageService"]), 16)
        self.assertEqual(len(per_service["pivirt.operations.v1.OperationService"]), 6)
        self.assertIn("pb.CoreRPC/CreateWorkload", per_service["pb.CoreRPC"])

    def test_info_through_reflection_only(self):
        rc, out, err = self.buf("-d", "{}", self.url + "/pb.CoreRPC/Info")
        self.assertEqual(rc, 0, err)
        info = json.loads(out)
        self.assertEqual(len(info["identifier"]), 64)
        self.assertIn("revison", info)

    def test_seed_example_through_reflection(self):
        body = json.dumps({"name": "prod-cluster",
                           "topology": {"control_plane_count": 3, "worker_count": 5},
                           "version": "v0.0.89"})
        rc, out, err = self.buf("-d", body,
                                self.url + "/pivirt.cluster.v1.ClusterService/CreateCluster")
        self.assertEqual(rc, 0, err)
        got = json.loads(out)
        self.assertEqual((got["name"], got["version"], got["status"]),
                         ("prod-cluster", "v0.0.89", "CLUSTER_STATUS_CREATING"))
        self.assertEqual(got["topology"]["controlPlaneCount"], 3)
        # the seed's GetHealth example: a cluster without nodes, and no worker in this stack
        rc, out, err = self.buf("-d", '{"cluster_id": "prod-cluster"}',
                                self.url + "/pivirt.cluster.v1.ClusterService/GetHealth")
        self.assertEqual(rc, 0, err)
        self.assertEqual(json.loads(out)["status"], "HEALTH_STATUS_UNHEALTHY")

    def test_health_through_reflection(self):
        rc, out, err = self.buf("-d", '{"service":"pb.CoreRPC"}',
                                self.url + "/grpc.health.v1.Health/Check")
        self.assertEqual(rc, 0, err)
        self.assertEqual(json.loads(out)["status"], "SERVING")


class Auth(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stack = pvtest.Stack(gateways=1, config={"auth": {"username": "admin",
                                                             "password": "s3cret"}})
        cls.stack.start(auth=("admin", "s3cret"))
        cls.ch = cls.stack.channel(0)

    @classmethod
    def tearDownClass(cls):
        cls.ch.close()
        cls.stack.stop()

    def info(self, md):
        return core_pb2_grpc.CoreRPCStub(self.ch).Info(core_pb2.Empty(), metadata=md, timeout=5)

    def test_missing_credentials(self):
        with self.assertRaises(grpc.RpcError) as e:
            self.info(None)
        self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
        self.assertIn('"admin"', e.exception.details())

    def test_wrong_password(self):
        with self.assertRaises(grpc.RpcError) as e:
            self.info([("admin", "nope")])
        self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
        self.assertNotIn("s3cret", e.exception.details())

    def test_right_password(self):
        self.assertEqual(len(self.info([("admin", "s3cret")]).identifier), 64)

    def test_health_answers_without_credentials_by_default(self):
        # auth.exempt_health (true by default) lets load balancers probe; e2e.test_security
        # covers both settings of it and of auth.exempt_reflection.
        self.assertEqual(check(self.ch), SERVING)
        self.assertEqual(check(self.ch, metadata=[("admin", "s3cret")]), SERVING)


class Configuration(unittest.TestCase):
    def run_gateway(self, *args, env=None):
        exe = os.path.join(os.environ["PV_BUILD_DIR"], "bin", "pivirt-gateway")
        e = dict(os.environ)
        e.update(env or {})
        return subprocess.run([exe, *args], capture_output=True, text=True, timeout=30, env=e)

    def test_uppercase_username_is_refused(self):
        p = self.run_gateway("--set", "auth.username=Admin", "--set", "auth.password=x")
        self.assertEqual(p.returncode, 2)
        self.assertIn("auth.username", p.stderr)

    def test_unknown_key_is_refused(self):
        p = self.run_gateway("--set", "gateway.lisen=1")
        self.assertEqual(p.returncode, 2)
        self.assertIn("gateway.lisen", p.stderr)

    def test_bad_env_value_is_refused(self):
        p = self.run_gateway(env={"PIVIRT_GATEWAY_THREADS": "many"})
        self.assertEqual(p.returncode, 2)
        self.assertIn("gateway.threads", p.stderr)

    def test_version(self):
        p = self.run_gateway("--version")
        self.assertEqual(p.returncode, 0)
        self.assertIn("pivirt-gateway", p.stdout)

    def test_port_in_use_fails_with_the_address(self):
        import socket
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        try:
            p = self.run_gateway("--set", "gateway.listen=127.0.0.1:%d" % port,
                                 "--set", "redis.addr=127.0.0.1:1")
            self.assertEqual(p.returncode, 1)
            self.assertIn("127.0.0.1:%d" % port, p.stderr)
        finally:
            s.close()


class TLS(unittest.TestCase):
    def test_tls_serves_with_certificate(self):
        key, crt, root = pvtest.make_tls_cert()
        stack = pvtest.Stack(gateways=1, config={"gateway": {"tls_cert": crt, "tls_key": key}})
        stack.start(tls_root=root)
        try:
            port = stack.gateways[0].addrs[0].rsplit(":", 1)[1]
            creds = grpc.ssl_channel_credentials(root_certificates=root)
            with grpc.secure_channel("localhost:" + port, creds) as ch:
                info = core_pb2_grpc.CoreRPCStub(ch).Info(core_pb2.Empty(), timeout=5)
                self.assertEqual(len(info.identifier), 64)
            with grpc.insecure_channel("localhost:" + port) as ch:
                with self.assertRaises(grpc.RpcError):
                    check(ch, timeout=3)
        finally:
            stack.stop()


class ServiceStatusAndShutdown(unittest.TestCase):
    def test_watch_service_status_follows_gateways(self):
        stack = pvtest.Stack(gateways=2, config={"gateway": {"heartbeat_seconds": 1}})
        stack.start()
        try:
            a0 = stack.gateways[0].addrs[0]
            a1 = stack.gateways[1].addrs[0]
            stream = core_pb2_grpc.CoreRPCStub(stack.channel(0)).WatchServiceStatus(
                core_pb2.Empty(), timeout=30)
            seen_both = seen_one = False
            deadline = time.monotonic() + 20
            for msg in stream:
                self.assertEqual(msg.interval_in_second, 2)
                addrs = set(msg.addresses)
                if not seen_both and {a0, a1} <= addrs:
                    seen_both = True
                    stack.gateways[1].stop()
                elif seen_both and addrs == {a0}:
                    seen_one = True
                    break
                self.assertLess(time.monotonic(), deadline, "no update in time: %s" % addrs)
            stream.cancel()
            self.assertTrue(seen_both and seen_one)
        finally:
            stack.stop()

    def test_graceful_shutdown_ends_streams_and_exits_zero(self):
        stack = pvtest.Stack(gateways=1)
        stack.start()
        try:
            ch = stack.channel(0)
            watch = ch.unary_stream("/grpc.health.v1.Health/Watch")(health_request(""),
                                                                   timeout=30)
            first = next(watch)
            self.assertEqual(health_status(first), SERVING)
            status_stream = core_pb2_grpc.CoreRPCStub(ch).WatchServiceStatus(core_pb2.Empty(),
                                                                            timeout=30)
            next(status_stream)
            gw = stack.gateways[0]
            t0 = time.monotonic()
            gw.proc.send_signal(signal.SIGTERM)
            statuses = []
            try:
                for m in watch:
                    statuses.append(health_status(m))
            except grpc.RpcError as e:
                self.assertEqual(e.code(), grpc.StatusCode.UNAVAILABLE)
            self.assertIn(NOT_SERVING, statuses)
            with self.assertRaises(grpc.RpcError) as e:
                for _ in status_stream:
                    pass
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)
            self.assertEqual(gw.proc.wait(timeout=15), 0)
            self.assertLess(time.monotonic() - t0, 10)
            ch.close()
        finally:
            stack.stop()

    def test_gateway_serves_while_redis_is_down(self):
        stack = pvtest.Stack(gateways=1)
        stack.start()
        try:
            stack.redis.kill9()
            ch = stack.channel(0)
            self.assertEqual(check(ch), SERVING)
            info = core_pb2_grpc.CoreRPCStub(ch).Info(core_pb2.Empty(), timeout=5)
            self.assertEqual(len(info.identifier), 64)
            stack.redis.restart()
            ch.close()
        finally:
            stack.stop()


if __name__ == "__main__":
    pvtest.main()
