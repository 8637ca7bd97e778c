#!/usr/bin/python3
"""./ops/pivirt itself: up, status, restarts under load, down, on a stack of its own.

A process SIGKILLed under load dies in two steps: its main thread becomes a zombie first, and
its other threads exit after it, holding its sockets until the last one has. ops/pivirt must
wait for all of them before it starts the successor on the same ports (a restart right after
used to fail with "bind: Address already in use"). Here `./ops/pivirt up` restarts what was
killed (the gateway, a worker, the scheduler, Redis) while clients keep calling the gateway,
and again for a configuration change (SIGTERM, then the successor), several times; every `up`
must bring every part back, and no log may show a port still taken. `./ops/pivirt status` must
report each process up (it reads the presence keys by name; no SCAN). DyingProcess makes that
state on purpose (a main thread that exits while another one holds a socket) and checks that
ops/pivirt's wait_gone returns only once the port is free.

The stack runs the sanitizer build's programs (PIVIRT_BIN_DIR, up --no-build) on free ports,
in a temporary data directory, with its own key prefix (libvirt names the `default` pool `up`
creates after it; the test deletes it at the end).
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest

import grpc

import pvtest

PIVIRT = os.path.join(pvtest.SOURCE_DIR, "ops", "pivirt")
NAMES = ["redis", "gateway", "scheduler", "worker-1", "worker-2", "agent"]


class Load:
    """Clients calling the gateway without pause (Info and Health) on a few channels, counting
    answers; failures while a part restarts are expected and only counted."""

    def __init__(self, addrs, threads=4):
        self.addrs = addrs
        self.ok = 0
        self.failed = 0
        self.lock = threading.Lock()
        self.stop_ev = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                        for i in range(threads)]

    def _run(self, i):
        ch = grpc.insecure_channel(self.addrs[i % len(self.addrs)])
        try:
            while not self.stop_ev.is_set():
                try:
                    pvtest.unary_raw(ch, "/pb.CoreRPC/Info", timeout=2)
                    pvtest.health_status_on(ch, timeout=2)
                    with self.lock:
                        self.ok += 1
                except grpc.RpcError:
                    with self.lock:
                        self.failed += 1
                    time.sleep(0.02)
        finally:
            ch.close()

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def answered(self):
        with self.lock:
            return self.ok

    def stop(self):
        self.stop_ev.set()
        for t in self.threads:
            t.join(timeout=10)


class OpsRestart(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        err = pvtest.ensure_libvirtd()
        if err:
            raise unittest.SkipTest(err)
        cls.tmp = tempfile.mkdtemp(prefix="pvtest-ops-")
        os.chmod(cls.tmp, 0o711)
        cls.data = os.path.join(cls.tmp, "data")
        cls.listen = ["127.0.0.1:%d" % pvtest.free_port(), "127.0.0.1:%d" % pvtest.free_port()]
        cls.prefix = "pvt%du:" % os.getpid()
        cls.env = dict(pvtest._clean_env(), PIVIRT_DATA_DIR=cls.data,
                       PIVIRT_REDIS_PORT=str(pvtest.free_port()),
                       PIVIRT_GATEWAY_LISTEN=",".join(cls.listen),
                       PIVIRT_METRICS_PORT=str(pvtest.free_port_block(4)),
                       PIVIRT_KEY_PREFIX=cls.prefix, PIVIRT_BIN_DIR=pvtest.BIN_DIR,
                       PIVIRT_LOG_LEVEL="info")
        cls.failed = False

    @classmethod
    def tearDownClass(cls):
        try:
            # The pool's libvirt definition outlives the stack: the system libvirtd is shared.
            pvtest.buf_curl(*pvtest.BUF_GRPC, "-d", '{"name":"default"}',
                            "http://%s/pivirt.storage.v1.StorageService/DeletePool" % cls.listen[0],
                            check=False, timeout=60)
        finally:
            cls.pivirt("down", timeout=120)
            if cls.failed:
                print("kept %s" % cls.tmp)
            else:
                shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def pivirt(cls, *args, timeout=300, **env):
        e = dict(cls.env, **env)
        return subprocess.run([PIVIRT] + list(args), capture_output=True, text=True,
                              timeout=timeout, env=e, stdin=subprocess.DEVNULL)

    def up(self, **env):
        r = self.pivirt("up", "--no-build", **env)
        if r.returncode != 0:
            type(self).failed = True
        self.assertEqual(r.returncode, 0, "up failed:\n%s\n%s" % (r.stdout, r.stderr[-4000:]))
        return r

    def pid(self, name):
        with open(os.path.join(self.data, "run", name + ".pid")) as f:
            return int(f.read().strip())

    def assert_status_up(self):
        r = self.pivirt("status", timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        lines = r.stdout.strip().splitlines()
        self.assertEqual([ln.split()[0] for ln in lines], NAMES, r.stdout)
        for ln in lines:
            self.assertEqual(ln.split()[-1], "up", r.stdout)

    def logs(self):
        out = {}
        logdir = os.path.join(self.data, "logs")
        for name in os.listdir(logdir):
            with open(os.path.join(logdir, name), errors="replace") as f:
                out[name] = f.read()
        return out

    def assert_no_bind_failure(self):
        for name, text in self.logs().items():
            self.assertNotRegex(text, re.compile("already in use", re.I), name)
            for mark in pvtest.SANITIZER_MARKS:
                self.assertNotIn(mark, text, name)

    def wait_answers(self, load, more_than, timeout=30):
        deadline = time.monotonic() + timeout
        while load.answered() <= more_than:
            self.assertLess(time.monotonic(), deadline, "the gateway never answered again")
            time.sleep(0.05)

    def test_b_a_daemon_up_starts_does_not_keep_the_lock(self):
        """On a machine where no libvirtd answers, up starts one; it must not inherit the data
        directory's lock, or status, down and up all fail "another ops/pivirt command is
        working" until it exits. A libvirtd and a virsh of the test's own stand in (the real
        libvirtd, which the agent uses, keeps running): virsh answers once the fake daemon,
        which stays running, has started."""
        fake = tempfile.mkdtemp(prefix="pvtest-fakebin-")
        mark, pidfile = os.path.join(fake, "started"), os.path.join(fake, "daemon.pid")
        with open(os.path.join(fake, "virsh"), "w") as f:
            f.write("#!/bin/sh\n[ -e %s ]\n" % mark)
        with open(os.path.join(fake, "libvirtd"), "w") as f:
            f.write("#!/bin/sh\n(exec sleep 120) >/dev/null 2>&1 </dev/null &\n"
                    "echo $! >%s\ntouch %s\n" % (pidfile, mark))
        for n in ("virsh", "libvirtd"):
            os.chmod(os.path.join(fake, n), 0o755)
        daemon = None
        try:
            r = self.up(PATH=fake + ":" + os.environ["PATH"])
            self.assertIn("starting libvirtd", r.stderr)
            with open(pidfile) as f:
                daemon = int(f.read())
            lock = os.path.realpath(os.path.join(self.data, "run", ".lock"))
            fds = os.listdir("/proc/%d/fd" % daemon)
            held = [fd for fd in fds
                    if os.path.realpath("/proc/%d/fd/%s" % (daemon, fd)) == lock]
            self.assertEqual(held, [], "the daemon holds the lock")
            r = self.pivirt("status")
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertNotIn("another ops/pivirt command", r.stderr)
        finally:
            if daemon:
                try:
                    os.kill(daemon, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            shutil.rmtree(fake, ignore_errors=True)

    def test_restarts_under_load_find_their_ports_free(self):
        self.up()
        self.assert_status_up()
        load = Load(self.listen).start()
        try:
            self.wait_answers(load, 50)
            cycles = [["gateway"], ["gateway", "worker-1", "scheduler"], ["redis", "gateway"],
                      ["gateway", "agent", "worker-2"]]
            for names in cycles:
                old = {n: self.pid(n) for n in names}
                for n in names:
                    os.kill(old[n], signal.SIGKILL)
                seen = load.answered()
                # at once: the killed processes' threads are still exiting
                self.up()
                for n in names:
                    self.assertNotEqual(self.pid(n), old[n], n)
                self.wait_answers(load, seen)
                self.assert_status_up()
            # A configuration change restarts every program in turn (SIGTERM, then its
            # successor), still under load.
            for level in ("warn", "info"):
                old = {n: self.pid(n) for n in NAMES[1:]}
                seen = load.answered()
                self.up(PIVIRT_LOG_LEVEL=level)
                for n in NAMES[1:]:
                    self.assertNotEqual(self.pid(n), old[n], n)
                self.wait_answers(load, seen)
                self.assert_status_up()
        finally:
            load.stop()
        self.assert_no_bind_failure()
        self.assertGreater(load.ok, 0)


# A process in the state a SIGKILL leaves for a few ms: the main thread is a zombie already,
# another thread still runs, and the process still holds its listening socket.
DYING = r"""
import ctypes, socket, sys, threading, time
s = socket.socket()
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
threading.Thread(target=time.sleep, args=(float(sys.argv[2]),)).start()
print("bound", flush=True)
ctypes.CDLL(None).pthread_exit(None)
"""


class DyingProcess(unittest.TestCase):
    """ops/pivirt's own functions (the script, sourced) on a process of the test's making."""

    def test_a_zombie_main_thread_is_waited_for_until_the_port_is_free(self):
        port = pvtest.free_port()
        child = subprocess.Popen(["/usr/bin/python3", "-c", DYING, str(port), "1.5"],
                                 stdout=subprocess.PIPE, text=True)
        try:
            self.assertEqual(child.stdout.readline().strip(), "bound")
            script = """
                source "$1"
                pid=$2
                for _ in $(seq 300); do pid_dying "$pid" && break; sleep 0.01; done
                pid_dying "$pid" || exit 3
                ! pid_alive "$pid" || exit 4
                echo dying
                read -r _ # the test tries the port meanwhile
                wait_gone "$pid" || exit 5
                pid_dying "$pid" && exit 6
                echo gone
            """
            sh = subprocess.Popen(["bash", "-c", script, "bash", PIVIRT, str(child.pid)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env=pvtest._clean_env())
            self.assertEqual(sh.stdout.readline().strip(), "dying")
            # The main thread is gone, as far as pid_alive can tell, but the port is not free:
            # a successor started now would fail to bind.
            probe = socket.socket()
            with self.assertRaises(OSError):
                probe.bind(("127.0.0.1", port))
            probe.close()
            out, _ = sh.communicate("\n", timeout=30)
            self.assertEqual(sh.returncode, 0, out)
            self.assertEqual(out.strip(), "gone")
            # wait_gone returned: the port is free at once.
            probe = socket.socket()
            probe.bind(("127.0.0.1", port))
            probe.close()
        finally:
            child.kill()
            child.wait(timeout=10)
            child.stdout.close()


if __name__ == "__main__":
    pvtest.main()
