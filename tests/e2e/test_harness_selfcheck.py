"""The e2e harness itself works: a Stack with one gateway comes up on a real Redis, the gateway
reports SERVING on both of its addresses (grpc.health.v1, raw bytes), Redis answers through
redis_cli, and stop() sees the gateway exit 0 after SIGTERM with clean sanitizer logs."""
import os
import signal
import unittest

import pvtest


class HarnessSelfCheck(unittest.TestCase):
    def test_stack_with_one_gateway(self):
        st = pvtest.Stack(gateways=1).start()
        try:
            gw = st.gateways[0]
            self.assertEqual(len(gw.addrs), 2)
            self.assertNotEqual(gw.addrs[0], gw.addrs[1])
            for addr in gw.addrs:
                self.assertEqual(pvtest.health_status(addr), pvtest.SERVING, addr)
            # The whole-server check and a channel from the stack agree.
            reply = pvtest.unary_raw(st.channel(0, 1), "/grpc.health.v1.Health/Check", b"")
            self.assertEqual(reply, b"\x08\x01")
            self.assertEqual(st.redis_cli("PING"), "PONG")
            self.assertEqual(st.redis.cmd("PING"), "PONG")
            self.assertTrue(gw.proc.alive())
        except BaseException:
            st.failed = True
            st.stop(check=False)
            raise
        st.stop()
        self.assertEqual(gw.proc.returncode, 0)
        self.assertFalse(gw.proc.alive())
        self.assertFalse(st.redis.alive())

    def test_redis_restart_keeps_data(self):
        # The harness's Redis survives a crash with its append-only file (fsync always here, so
        # the write is on disk before the reply).
        workdir = pvtest.tempfile.mkdtemp(prefix="pvtest-redis-")
        r = pvtest.Redis(workdir, appendfsync="always").start()
        try:
            self.assertEqual(r.cmd("SET", "pvt:k", "v1"), "OK")
            self.assertEqual(r.kill9(), -signal.SIGKILL)
            self.assertFalse(r.ping())
            r.restart()
            self.assertEqual(r.cmd("GET", "pvt:k"), "v1")
            self.assertEqual(r.stop(), 0)
        finally:
            r.kill9()
        pvtest.shutil.rmtree(workdir, ignore_errors=True)

    def test_sanitizer_reports_are_found(self):
        workdir = pvtest.tempfile.mkdtemp(prefix="pvtest-proc-")
        try:
            p = pvtest.Proc("fake", ["/bin/sh", "-c", "echo 'x.c:3:5: runtime error: signed "
                                     "integer overflow' >&2; exit 0"], workdir)
            p.start()
            self.assertEqual(p.wait(timeout=10), 0)
            with self.assertRaises(AssertionError):
                p.assert_clean()
            q = pvtest.Proc("quiet", ["/bin/sh", "-c", "echo fine"], workdir)
            q.start()
            self.assertEqual(q.wait(timeout=10), 0)
            q.assert_clean()
            self.assertIn("fine", q.log())
        finally:
            pvtest.shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    pvtest.main()
