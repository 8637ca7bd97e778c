#!/usr/bin/python3
"""End-to-end tests of the security boundaries (issue 9): mutual TLS on the gateway with
certificates made by openssl here, which services answer without credentials, the bound on
unfinished operations per client, message size and concurrent stream limits, and Redis under an
ACL user that has only the commands the system uses.
"""
import json
import os
import subprocess
import tempfile
import threading
import time
import unittest

import grpc

import pvtest
from pb import core_pb2, core_pb2_grpc
from pivirt.operations.v1 import operations_pb2 as opb
from pivirt.operations.v1 import operations_pb2_grpc as opg

REFLECTION_V1 = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
LIST_SERVICES = b"\x3a\x00"  # ServerReflectionRequest{list_services: ""}


def openssl(*args):
    subprocess.run(["openssl"] + list(args), check=True, capture_output=True)


class Pki:
    """A CA, a server certificate for localhost and client certificates, all made by openssl
    in a temporary directory. Paths are attributes; pem(name) reads one."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="pv-pki-")
        self.ca_key, self.ca_crt = self.path("ca.key"), self.path("ca.crt")
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                "-subj", "/CN=pivirt test CA", "-keyout", self.ca_key, "-out", self.ca_crt)
        self.server_key, self.server_crt = self.signed("server", "localhost",
                                                       san="DNS:localhost")

    def path(self, name):
        return os.path.join(self.dir, name)

    def signed(self, name, cn, san=None):
        """A key and a certificate for CN signed by the CA: (key path, certificate path)."""
        key, csr, crt = self.path(name + ".key"), self.path(name + ".csr"), self.path(name + ".crt")
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=" + cn,
                "-keyout", key, "-out", csr)
        args = ["x509", "-req", "-in", csr, "-CA", self.ca_crt, "-CAkey", self.ca_key,
                "-CAcreateserial", "-days", "1", "-out", crt]
        if san:
            ext = self.path(name + ".ext")
            with open(ext, "w") as f:
                f.write("subjectAltName=%s\n" % san)
            args += ["-extfile", ext]
        openssl(*args)
        return key, crt

    def self_signed(self, name, cn):
        key, crt = self.path(name + ".key"), self.path(name + ".crt")
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                "-subj", "/CN=" + cn, "-keyout", key, "-out", crt)
        return key, crt

    @staticmethod
    def pem(path):
        with open(path, "rb") as f:
            return f.read()


def tls_channel(addr, root, cert=None, key=None):
    """A channel to ADDR (127.0.0.1:PORT) verifying the server as localhost, showing the client
    certificate CERT/KEY (paths) when given. Its own connection (no shared subchannel)."""
    creds = grpc.ssl_channel_credentials(
        root_certificates=root,
        private_key=Pki.pem(key) if key else None,
        certificate_chain=Pki.pem(cert) if cert else None)
    return grpc.secure_channel(addr, creds, options=[("grpc.ssl_target_name_override", "localhost"),
                                                      ("grpc.use_local_subchannel_pool", 1)])


def info(ch, md=None, timeout=5):
    return core_pb2_grpc.CoreRPCStub(ch).Info(core_pb2.Empty(), metadata=md, timeout=timeout)


def rpc_error(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except grpc.RpcError as e:
        return e
    raise AssertionError("the call succeeded; an error was expected")


def create_op(ch, target, md=None):
    return opg.OperationServiceStub(ch).CreateTestOperation(
        opb.CreateTestOperationRequest(kind="test.sleep", target=target, params={"ms": "60000"}),
        metadata=md, timeout=10)


def reflection_services(ch, md=None):
    call = ch.stream_stream(REFLECTION_V1)(iter([LIST_SERVICES]), metadata=md, timeout=5)
    return next(iter(call))


def pvcli(addr, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIVIRT_")}
    env["PIVIRT_ENDPOINT"] = addr
    return subprocess.run([os.path.join(pvtest.BIN_DIR, "pvcli")] + list(args), env=env,
                          capture_output=True, text=True, timeout=60)


class MutualTLS(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.pki = Pki()
        cls.root = Pki.pem(cls.pki.ca_crt)
        cls.a_key, cls.a_crt = cls.pki.signed("client-a", "client-a")
        cls.b_key, cls.b_crt = cls.pki.signed("client-b", "client-b")
        cls.stack = pvtest.Stack(gateways=1, config={"gateway": {
            "tls_cert": cls.pki.server_crt, "tls_key": cls.pki.server_key,
            "tls_client_ca": cls.pki.ca_crt, "max_pending_ops_per_client": 2}})
        cls.stack.start(tls_root=cls.root,
                        tls_client=(Pki.pem(cls.a_crt), Pki.pem(cls.a_key)))
        cls.addr = cls.stack.gateways[0].addrs[0]
        cls.port = cls.addr.rsplit(":", 1)[1]

    @classmethod
    def tearDownClass(cls):
        cls.stack.stop()

    def test_client_with_a_signed_certificate_is_served(self):
        with tls_channel(self.addr, self.root, self.a_crt, self.a_key) as ch:
            self.assertEqual(len(info(ch).identifier), 64)
            self.assertEqual(pvtest.health_status_on(ch), pvtest.SERVING)

    def test_client_without_a_certificate_is_refused_at_the_handshake(self):
        with tls_channel(self.addr, self.root) as ch:
            e = rpc_error(info, ch, timeout=3)
        # No handler ran: the connection never came up.
        self.assertEqual(e.code(), grpc.StatusCode.UNAVAILABLE, e.details())

    def test_client_with_a_certificate_the_ca_did_not_sign_is_refused(self):
        key, crt = self.pki.self_signed("intruder", "client-a")  # same name, other issuer
        with tls_channel(self.addr, self.root, crt, key) as ch:
            e = rpc_error(info, ch, timeout=3)
        self.assertEqual(e.code(), grpc.StatusCode.UNAVAILABLE, e.details())

    def test_plaintext_client_is_refused(self):
        with grpc.insecure_channel(self.addr) as ch:
            e = rpc_error(info, ch, timeout=3)
        self.assertEqual(e.code(), grpc.StatusCode.UNAVAILABLE)

    def test_pvcli_shows_its_certificate(self):
        endpoint = "localhost:" + self.port
        r = pvcli(endpoint, "--tls-ca", self.pki.ca_crt, "--tls-cert", self.a_crt,
                  "--tls-key", self.a_key, "cluster", "list")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split()[:2], ["NAME", "STATUS"])
        r = pvcli(endpoint, "--tls-ca", self.pki.ca_crt, "cluster", "list")
        self.assertEqual(r.returncode, 1)
        self.assertIn("UNAVAILABLE", r.stderr)
        r = pvcli(endpoint, "--tls-ca", self.pki.ca_crt, "--tls-cert", self.a_crt,
                  "cluster", "list")
        self.assertEqual(r.returncode, 1)
        self.assertIn("TLS client key file (none)", r.stderr)

    def test_pending_operations_are_counted_per_certificate(self):
        # The bound is 2 per client; a client is the certificate's common name here.
        with tls_channel(self.addr, self.root, self.a_crt, self.a_key) as a, \
                tls_channel(self.addr, self.root, self.b_crt, self.b_key) as b:
            create_op(a, "mtls-a1")
            create_op(a, "mtls-a2")
            e = rpc_error(create_op, a, "mtls-a3")
            self.assertEqual(e.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
            self.assertIn("cert:client-a", e.details())
            self.assertIn("gateway.max_pending_ops_per_client", e.details())
            self.assertEqual(create_op(b, "mtls-b1").status, opb.OPERATION_STATUS_PENDING)


class MutualTLSConfiguration(unittest.TestCase):
    def test_client_ca_without_server_certificate_is_refused(self):
        exe = os.path.join(pvtest.BIN_DIR, "pivirt-gateway")
        p = subprocess.run([exe, "--set", "gateway.tls_client_ca=/nonexistent/ca.pem"],
                           capture_output=True, text=True, timeout=30,
                           env={k: v for k, v in os.environ.items() if not k.startswith("PIVIRT_")})
        self.assertEqual(p.returncode, 2)
        self.assertIn("gateway.tls_client_ca", p.stderr)

    def test_unreadable_client_ca_stops_the_gateway_naming_it(self):
        pki = Pki()
        exe = os.path.join(pvtest.BIN_DIR, "pivirt-gateway")
        p = subprocess.run([exe, "--set", "gateway.tls_cert=" + pki.server_crt,
                            "--set", "gateway.tls_key=" + pki.server_key,
                            "--set", "gateway.tls_client_ca=/nonexistent/ca.pem",
                            "--set", "gateway.listen=127.0.0.1:%d" % pvtest.free_port(),
                            "--set", "redis.addr=127.0.0.1:1"],
                           capture_output=True, text=True, timeout=30,
                           env={k: v for k, v in os.environ.items() if not k.startswith("PIVIRT_")})
        self.assertEqual(p.returncode, 1)
        self.assertIn("/nonexistent/ca.pem", p.stderr)


class HealthAndReflectionAuth(unittest.TestCase):
    def start(self, **auth):
        cfg = {"auth": dict({"username": "admin", "password": "s3cret"}, **auth)}
        st = pvtest.Stack(gateways=1, config=cfg)
        st.start(auth=("admin", "s3cret"))
        self.addCleanup(st.stop)
        self.stack_gateway_pid = st.gateways[0].proc.pid
        return st.channel(0)

    def test_defaults_health_open_reflection_needs_credentials(self):
        ch = self.start()
        self.assertEqual(pvtest.health_status_on(ch), pvtest.SERVING)
        e = rpc_error(reflection_services, ch)
        self.assertEqual(e.code(), grpc.StatusCode.UNAUTHENTICATED)
        self.assertIn('"admin"', e.details())
        self.assertIn(b"pb.CoreRPC", reflection_services(ch, md=[("admin", "s3cret")]))
        # The other services still need the credentials.
        self.assertEqual(rpc_error(info, ch).code(), grpc.StatusCode.UNAUTHENTICATED)

    def test_health_closed_reflection_open(self):
        ch = self.start(exempt_health=False, exempt_reflection=True)
        e = rpc_error(pvtest.health_status_on, ch)
        self.assertEqual(e.code(), grpc.StatusCode.UNAUTHENTICATED)
        self.assertEqual(pvtest.health_status_on(ch, metadata=[("admin", "s3cret")]),
                         pvtest.SERVING)
        self.assertIn(b"pb.CoreRPC", reflection_services(ch))
        self.assertEqual(rpc_error(info, ch).code(), grpc.StatusCode.UNAUTHENTICATED)

    def test_an_upload_without_credentials_is_not_read(self):
        # With auth on, a request is read only after its credentials were checked: BuildImage
        # RAW of 48 MiB (under gateway.max_upload_bytes, 64 MiB) from four clients without them
        # at once is refused UNAUTHENTICATED, and the gateway's peak memory grows by far less
        # than one of them (the core would hold each whole before the gateway saw the call).
        ch = self.start()
        pid = self.stack_gateway_pid
        hwm0 = vm_hwm_kib(pid)
        body = core_pb2.BuildImageOptions(name="big", build_method=core_pb2.BuildImageOptions.RAW,
                                          tar=b"\0" * (48 << 20)).SerializeToString()
        errors = []

        def upload():
            try:
                list(ch.unary_stream("/pb.CoreRPC/BuildImage")(body, timeout=60))
            except grpc.RpcError as e:
                errors.append(e.code())

        threads = [threading.Thread(target=upload) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [grpc.StatusCode.UNAUTHENTICATED] * 4)
        grown = vm_hwm_kib(pid) - hwm0
        self.assertLess(grown, 32 << 10, "the gateway's peak RSS grew by %d KiB" % grown)


def vm_hwm_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM for pid %d" % pid)


class PendingOperationsPerClient(unittest.TestCase):
    """No worker runs, so every operation stays PENDING."""

    @classmethod
    def setUpClass(cls):
        cls.stack = pvtest.Stack(gateways=1, config={"gateway": {"max_pending_ops_per_client": 3}})
        cls.stack.start()

    @classmethod
    def tearDownClass(cls):
        cls.stack.stop()

    def test_over_the_bound_is_refused_and_nothing_is_queued(self):
        ch = self.stack.channel(0)
        s = opg.OperationServiceStub(ch)
        ops = [create_op(ch, "p%d" % i) for i in range(3)]
        queue = self.stack.key("{ops}:q:ops")
        index = self.stack.key("{ops}:index")
        self.assertEqual(self.stack.redis.cmd("XLEN", queue), 3)
        e = rpc_error(create_op, ch, "p3")
        self.assertEqual(e.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertIn("host:127.0.0.1 has 3 unfinished operations", e.details())
        self.assertIn("gateway.max_pending_ops_per_client) is 3", e.details())
        self.assertEqual(self.stack.redis.cmd("XLEN", queue), 3)
        self.assertEqual(self.stack.redis.cmd("ZCARD", index), 3)
        self.assertEqual(self.stack.redis.cmd("EXISTS", self.stack.key("{ops}:lock:p3")), 0)
        # A retry of an accepted call (same x-request-id) is answered, not refused.
        rid = [("x-request-id", "pending-rid-1")]
        s.CancelOperation(opb.CancelOperationRequest(id=ops[0].id), timeout=5)
        first = create_op(ch, "p4", md=rid)
        self.assertEqual(create_op(ch, "p4", md=rid).id, first.id)
        self.assertEqual(rpc_error(create_op, ch, "p5").code(),
                         grpc.StatusCode.RESOURCE_EXHAUSTED)
        # An operation that ends frees its place.
        s.CancelOperation(opb.CancelOperationRequest(id=ops[1].id), timeout=5)
        got = s.GetOperation(opb.GetOperationRequest(id=ops[1].id), timeout=5)
        self.assertEqual(got.status, opb.OPERATION_STATUS_CANCELLED)
        self.assertEqual(create_op(ch, "p6").status, opb.OPERATION_STATUS_PENDING)
        self.assertEqual(self.stack.redis.cmd("ZCARD", index), 5)

    def test_the_authenticated_user_is_the_client(self):
        st = pvtest.Stack(gateways=1, config={"auth": {"username": "admin", "password": "pw"},
                                              "gateway": {"max_pending_ops_per_client": 1}})
        st.start(auth=("admin", "pw"))
        try:
            ch = st.channel(0)
            md = [("admin", "pw")]
            create_op(ch, "u1", md=md)
            e = rpc_error(create_op, ch, "u2", md=md)
            self.assertEqual(e.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
            self.assertIn("user:admin", e.details())
        finally:
            st.stop()


class MessageSizeAndStreams(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stack = pvtest.Stack(gateways=1, config={"gateway": {
            "max_request_bytes": 65536, "max_upload_bytes": 262144,
            "max_concurrent_streams": 2}})
        cls.stack.start()

    @classmethod
    def tearDownClass(cls):
        cls.stack.stop()

    def big_health_request(self, n):
        # HealthCheckRequest{service: "a" * n}
        return b"\x0a" + pvtest._varint(n) + b"a" * n

    def test_request_over_max_request_bytes_is_resource_exhausted(self):
        with grpc.insecure_channel(self.stack.gateways[0].addrs[0]) as ch:
            for method in ("/grpc.health.v1.Health/Check", "/pb.CoreRPC/Info"):
                e = rpc_error(pvtest.unary_raw, ch, method, self.big_health_request(100000))
                self.assertEqual(e.code(), grpc.StatusCode.RESOURCE_EXHAUSTED, method)
                self.assertIn("gateway.max_request_bytes", e.details())
                self.assertIn("65536", e.details())
            self.assertEqual(pvtest.health_status_on(ch), pvtest.SERVING)

    def test_uploads_are_bounded_by_max_upload_bytes(self):
        # BuildImage and Send carry an image or files in one message: gateway.max_upload_bytes
        # (256 KiB here) bounds them, not gateway.max_request_bytes (64 KiB), which still
        # bounds every other method.
        core = core_pb2_grpc.CoreRPCStub(self.stack.channel(0))
        raw = core_pb2.BuildImageOptions.RAW

        def build(n):
            list(core.BuildImage(core_pb2.BuildImageOptions(
                name="up", build_method=raw, tar=b"x" * n), timeout=30))

        def send(n):
            list(core.Send(core_pb2.SendOptions(IDs=["nosuch"], data={"/f": b"x" * n}),
                           timeout=30))

        for call in (build, send):
            e = rpc_error(call, 300000)
            self.assertEqual(e.code(), grpc.StatusCode.RESOURCE_EXHAUSTED, e.details())
            self.assertIn("gateway.max_upload_bytes", e.details())
            self.assertIn("262144", e.details())
            # over max_request_bytes but under max_upload_bytes: past the size check (no
            # node takes it here)
            try:
                call(200000)
            except grpc.RpcError as e:
                self.assertNotEqual(e.code(), grpc.StatusCode.RESOURCE_EXHAUSTED, e.details())
                self.assertNotIn("max_", e.details())

    def test_request_over_the_transport_bound_is_resource_exhausted_not_a_crash(self):
        # 20 MiB: past the core's own bound (16 MiB here), refused before any handler.
        with grpc.insecure_channel(self.stack.gateways[0].addrs[0]) as ch:
            e = rpc_error(pvtest.unary_raw, ch, "/grpc.health.v1.Health/Check",
                          self.big_health_request(20 << 20), timeout=30)
            self.assertEqual(e.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
            self.assertEqual(pvtest.health_status_on(ch), pvtest.SERVING)
        self.assertTrue(self.stack.gateways[0].proc.alive())

    def test_concurrent_streams_per_connection(self):
        addr = self.stack.gateways[0].addrs[0]
        opts = [("grpc.use_local_subchannel_pool", 1)]
        with grpc.insecure_channel(addr, options=opts) as ch, \
                grpc.insecure_channel(addr, options=opts) as other:
            watch = ch.unary_stream("/grpc.health.v1.Health/Watch")
            w1, w2 = watch(b"", timeout=60), watch(b"", timeout=60)
            self.assertEqual(next(w1), b"\x08\x01")  # SERVING
            self.assertEqual(next(w2), b"\x08\x01")
            # Both streams the server allows this connection are open: a third call waits for
            # one to end (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS) ...
            e = rpc_error(pvtest.health_status_on, ch, timeout=2)
            self.assertEqual(e.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
            # ... while another connection is served at once ...
            self.assertEqual(pvtest.health_status_on(other, timeout=5), pvtest.SERVING)
            # ... and this one as soon as a stream ends.
            w1.cancel()
            self.assertEqual(pvtest.health_status_on(ch, timeout=5), pvtest.SERVING)
            w2.cancel()



class StreamsPerClient(unittest.TestCase):
    """gateway.max_streams_per_client counts a client's open streaming calls over all of its
    connections (the client here is its host, 127.0.0.1: no auth, no certificate)."""

    @classmethod
    def setUpClass(cls):
        cls.stack = pvtest.Stack(gateways=1, config={"gateway": {"max_streams_per_client": 3}})
        cls.stack.start()

    @classmethod
    def tearDownClass(cls):
        cls.stack.stop()

    def test_one_stream_over_the_bound_is_resource_exhausted(self):
        addr = self.stack.gateways[0].addrs[0]
        opts = [("grpc.use_local_subchannel_pool", 1)]
        chans = [grpc.insecure_channel(addr, options=opts) for _ in range(5)]
        try:
            watches = [ch.unary_stream("/grpc.health.v1.Health/Watch")(b"", timeout=60)
                       for ch in chans[:3]]
            for w in watches:
                self.assertEqual(next(w), b"\x08\x01")  # SERVING: each stream is open
            # a fourth, on a connection of its own: refused at once, naming the limit
            fourth = chans[3].unary_stream("/grpc.health.v1.Health/Watch")(b"", timeout=10)
            with self.assertRaises(grpc.RpcError) as cm:
                next(fourth)
            self.assertEqual(cm.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
            self.assertIn("gateway.max_streams_per_client", cm.exception.details())
            self.assertIn("has 3 streams open", cm.exception.details())
            # unary calls are not streams: still served
            self.assertEqual(pvtest.health_status_on(chans[4], timeout=5), pvtest.SERVING)
            # a stream that ends gives its place back
            watches[0].cancel()
            deadline = time.monotonic() + 10
            while True:
                w = chans[4].unary_stream("/grpc.health.v1.Health/Watch")(b"", timeout=10)
                try:
                    self.assertEqual(next(w), b"\x08\x01")
                    w.cancel()
                    break
                except grpc.RpcError as e:
                    self.assertEqual(e.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
                    self.assertLess(time.monotonic(), deadline, "the place never came back")
                    time.sleep(0.1)
            for w in watches[1:]:
                w.cancel()
        finally:
            for ch in chans:
                ch.close()
        self.assertTrue(self.stack.gateways[0].proc.alive())


class RedisACL(unittest.TestCase):
    """Every Stack runs Redis with ops/redis.acl's users and the programs as its `pivirt` user
    (and Stack.stop fails on any command Redis refused them); here a whole stack at work, what
    the user must not do, and where its password must not show."""

    AUTH_PASSWORD = "gw-Secret-4711"

    @classmethod
    def setUpClass(cls):
        cls.stack = pvtest.Stack(gateways=1, workers=1, schedulers=1, agents=["sec1"], config={
            "auth": {"username": "admin", "password": cls.AUTH_PASSWORD},
            "worker": {"heartbeat_seconds": 1}})
        cls.stack.start(auth=("admin", cls.AUTH_PASSWORD))
        cls.md = [("admin", cls.AUTH_PASSWORD)]

    @classmethod
    def tearDownClass(cls):
        cls.stack.stop()

    def pivirt_client(self):
        return pvtest.RespClient("127.0.0.1", self.stack.redis.port,
                                 auth=(pvtest.REDIS_USER, self.stack.redis.password))

    def test_programs_log_in_as_the_acl_user_and_work(self):
        st = self.stack
        self.assertEqual(st.config["redis"]["username"], "pivirt")
        # An operation through the ops worker, a cluster operation through pvcli, a plan
        # through the scheduler: each path of the system under the restricted user.
        ops = opg.OperationServiceStub(st.channel(0))
        op = ops.CreateTestOperation(opb.CreateTestOperationRequest(
            kind="test.sleep", target="acl-t1", params={"ms": "100", "steps": "2"}),
            metadata=self.md, timeout=10)
        got = ops.WaitOperation(opb.WaitOperationRequest(id=op.id, timeout_seconds=20),
                                metadata=self.md, timeout=30)
        self.assertEqual(got.status, opb.OPERATION_STATUS_SUCCEEDED, got)
        # The scheduler's plan: what fits on the one node.
        cap = core_pb2_grpc.CoreRPCStub(st.channel(0)).CalculateCapacity(
            core_pb2.DeployOptions(
                name="acl-app", podname="local", count=1, nodenames=["sec1"],
                entrypoint=core_pb2.EntrypointOptions(name="e"),
                deploy_strategy=core_pb2.DeployOptions.DUMMY,
                resources={"cpumem": json.dumps({"memory-request": "1M"}).encode()}),
            metadata=self.md, timeout=20)
        self.assertGreater(cap.total, 0)
        r = pvcli(st.gateways[0].addrs[0], "--user", "admin", "--password", self.AUTH_PASSWORD,
                  "node", "cordon", "local", "sec1")
        self.assertEqual(r.returncode, 0, r.stderr)
        r = pvcli(st.gateways[0].addrs[0], "--user", "admin", "--password", self.AUTH_PASSWORD,
                  "-o", "json", "node", "get", "local", "sec1")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("CORDONED", r.stdout)
        # Every connection the programs hold is the pivirt user's; only the harness's own
        # (this CLIENT LIST) is the default user's.
        users = {}
        for line in st.redis.cmd("CLIENT", "LIST").splitlines():
            f = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
            users[f["user"]] = users.get(f["user"], 0) + 1
        self.assertEqual(users.get("default"), 1, users)
        self.assertGreaterEqual(users.get("pivirt", 0), 8, users)
        self.assertEqual(st.redis.acl_denials(), {})

    def test_acl_user_is_refused_what_it_must_not_do(self):
        # A key of our own shows that nothing was flushed (the programs keep writing, so the
        # key count moves by itself).
        marker = self.stack.key("acl-marker")
        self.assertEqual(self.stack.redis.cmd("SET", marker, "1"), "OK")
        c = self.pivirt_client()
        try:
            for cmd in (["FLUSHALL"], ["FLUSHDB"], ["KEYS", "*"], ["CONFIG", "GET", "*"],
                        ["CONFIG", "SET", "appendonly", "no"], ["DEBUG", "SLEEP", "0"],
                        ["SHUTDOWN", "NOSAVE"], ["ACL", "LIST"], ["ACL", "SETUSER", "x", "on"],
                        ["FUNCTION", "FLUSH"], ["FUNCTION", "DELETE", "pv"], ["SCRIPT", "FLUSH"],
                        ["MODULE", "LIST"], ["CLIENT", "LIST"], ["CLIENT", "KILL", "ID", "1"],
                        ["REPLICAOF", "127.0.0.1", "1"], ["SAVE"], ["BGREWRITEAOF"],
                        ["MIGRATE", "127.0.0.1", "1", "k", "0", "10"], ["RENAME", "a", "b"],
                        ["SORT", "k"], ["MONITOR"], ["SWAPDB", "0", "1"], ["SELECT", "1"]):
                if cmd == ["SELECT", "1"]:
                    continue  # allowed (redis.db); its keys are the ACL's ~* too
                with self.assertRaises(pvtest.RedisError, msg=" ".join(cmd)) as e:
                    c.command(*cmd)
                # DEBUG is off for everyone (enable-debug-command), before the ACL is asked.
                self.assertRegex(str(e.exception), "^(NOPERM|ERR DEBUG command not allowed)",
                                 cmd)
            self.assertEqual(c.command("PING"), "PONG")
            denied = self.stack.redis.acl_denials()
            for obj in ("flushall", "flushdb", "keys", "config|set", "acl|setuser",
                        "function|flush", "shutdown", "migrate"):
                self.assertIn(obj, denied)
        finally:
            c.close()
            # These refusals were asked for: the stack's final check must not count them.
            self.stack.redis.cmd("ACL", "LOG", "RESET")
        self.assertEqual(self.stack.redis.cmd("GET", marker), "1")
        self.assertGreater(self.stack.redis.cmd("DBSIZE"), 1)
        self.assertEqual(self.stack.redis.cmd("CONFIG", "GET", "appendonly"), ["appendonly", "yes"])

    def test_redis_refuses_clients_without_a_password(self):
        c = pvtest.RespClient("127.0.0.1", self.stack.redis.port)
        try:
            with self.assertRaises(pvtest.RedisError) as e:
                c.command("GET", "x")
            self.assertIn("NOAUTH", str(e.exception))
            with self.assertRaises(pvtest.RedisError) as e:
                c.command("AUTH", "pivirt", "not-the-password")
            self.assertIn("WRONGPASS", str(e.exception))
        finally:
            c.close()

    def test_passwords_never_in_logs_info_or_the_config_dump(self):
        st = self.stack
        secrets = [st.redis.password.encode(), st.redis.admin_password.encode(),
                   self.AUTH_PASSWORD.encode()]
        # The effective configuration of each program masks them.
        for binary in ("pivirt-gateway", "pivirt-worker", "pivirt-scheduler"):
            r = subprocess.run([os.path.join(pvtest.BIN_DIR, binary), "--config",
                                st.config_path, "--print-config"],
                               capture_output=True, timeout=30, env=pvtest._clean_env())
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn(b'"password": "***"', r.stdout)
            self.assertIn(b'"username": "pivirt"', r.stdout)
            for secret in secrets:
                self.assertNotIn(secret, r.stdout + r.stderr, binary)
        reply = pvtest.unary_raw(st.channel(0), "/pb.CoreRPC/Info", b"", metadata=self.md)
        # A program given a wrong Redis password says so without showing it.
        wrong = "Wrong-Redis-Pw-9931"
        log = os.path.join(st.tmpdir, "wrong-password.log")
        with open(log, "wb") as out:
            p = subprocess.Popen([os.path.join(pvtest.BIN_DIR, "pivirt-scheduler"), "--config",
                                  st.config_path, "--set", "redis.password=" + wrong],
                                 stdout=out, stderr=subprocess.STDOUT, env=pvtest._clean_env())
            time.sleep(2.5)
            p.terminate()
            p.wait(timeout=15)
        text = open(log, "rb").read()
        self.assertIn(b"WRONGPASS", text)
        self.assertNotIn(wrong.encode(), text)
        for path in [p.log_path for p in st.procs] + [st.redis.proc.log_path, log]:
            data = open(path, "rb").read()
            for secret in secrets:
                self.assertNotIn(secret, data, path)
        for secret in secrets:
            self.assertNotIn(secret, reply)


if __name__ == "__main__":
    pvtest.main()
