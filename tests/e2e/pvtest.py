"""pvtest: the harness of pivirt's end-to-end tests (not a test itself).

Every e2e test runs real processes: a real redis-server on a free port in a temporary
directory, the real pivirt programs from the build, and real gRPC clients (Debian's
python3-grpcio, `buf curl`). Nothing is mocked.

    import pvtest

    class Health(unittest.TestCase):
        def test_serving(self):
            with pvtest.Stack(gateways=1) as st:
                self.assertEqual(pvtest.health_status(st.gateways[0].addrs[0]), pvtest.SERVING)

    if __name__ == "__main__":
        pvtest.main()

A Stack starts with start() (or a `with` block); start(auth=(user, password)) and
start(tls_root=PEM) for gateways that need them.

Pieces: free_port(); Redis (start, stop, kill9, restart on the same port and directory, cmd);
Proc (one program, its log, stop() returning the exit code, assert_clean() for sanitizer
reports); Stack (config, Redis and the processes, waits until each answers, stop() checks exit
codes and logs); buf_curl(); health_status(); unary_raw(); main().

Environment (set by ctest and ops/pivirt): PV_BUILD_DIR (programs in bin/), PV_SOURCE_DIR,
PV_REDIS_SERVER, PV_BUF. Without them the defaults are <repo>/build, the repository of this file,
redis-server from PATH and <repo>/.tools/node_modules/.bin/buf. Runs with /usr/bin/python3
(Debian's grpc only imports there); stdlib, grpc and ops/lib/grpc_health.py only.
"""

import atexit
import ctypes
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import unittest
import urllib.parse

# The harness forks (subprocess with preexec_fn) while grpc's threads run; grpcio's fork handlers
# then abort at random (thread_pool.cc "state_ == State::kRunning"). The children exec at once
# and never use grpc, so fork support is not wanted. Must be set before grpc is imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
import grpc  # noqa: E402

# The abort above also comes when a fork lands while grpc shuts its thread pool down, which it
# does each time the last channel of the process closes (the pool's state is then no longer
# "running" when its fork handler runs). One channel that lives as long as the process keeps
# grpc initialised, so the pool never shuts down between tests. It never connects.
_GRPC_KEEPALIVE = grpc.insecure_channel("127.0.0.1:9")

SOURCE_DIR = os.environ.get("PV_SOURCE_DIR") or os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The health check's wire form is the operators' script's (ops/lib/grpc_health.py), not a copy.
sys.path.insert(0, os.path.join(SOURCE_DIR, "ops", "lib"))
import grpc_health  # noqa: E402

_varint = grpc_health.varint
BUILD_DIR = os.environ.get("PV_BUILD_DIR") or os.path.join(SOURCE_DIR, "build")
BIN_DIR = os.path.join(BUILD_DIR, "bin")
REDIS_SERVER = os.environ.get("PV_REDIS_SERVER") or shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_CLI = shutil.which("redis-cli", path=os.path.dirname(REDIS_SERVER)) or shutil.which("redis-cli") or "redis-cli"
REDIS_CONF = os.path.join(SOURCE_DIR, "ops", "redis.conf")
# The users ops/redis.conf's `aclfile users.acl` loads (from the data directory): the rules ship
# in ops/redis.acl without passwords; Redis.start() writes them with this run's passwords.
REDIS_ACL = os.path.join(SOURCE_DIR, "ops", "redis.acl")
REDIS_USER = "pivirt"              # what the programs log in as: only the commands they use
# The harness's own connections: the default user, password-protected, with every command (it
# cannot be switched off: Redis 7.0 replays MULTI/EXEC from the append-only file as the default
# user, so a default user without commands loses those transactions at restart).
REDIS_ADMIN_USER = "default"
# ACL refusals of the programs' user that are expected: the gateway asks for
# notify-keyspace-events once per watcher and relies on redis.conf when refused.
REDIS_EXPECTED_DENIALS = {"config|get"}
BUF = os.environ.get("PV_BUF") or os.path.join(SOURCE_DIR, ".tools", "node_modules", ".bin", "buf")

# How long processes may take to answer after start; sanitizer builds start slowly.
START_TIMEOUT = float(os.environ.get("PV_START_TIMEOUT", "30"))
STOP_TIMEOUT = 15.0
# Default deadline of the harness's own gRPC calls.
CALL_TIMEOUT = 10.0

# grpc.health.v1.HealthCheckResponse.ServingStatus
UNKNOWN, SERVING, NOT_SERVING, SERVICE_UNKNOWN = 0, 1, 2, 3

# Arguments that make `buf curl` speak plain gRPC over HTTP/2 without TLS.
BUF_GRPC = ("--protocol", "grpc", "--http2-prior-knowledge")

# Lines a sanitizer writes when it found something.
SANITIZER_MARKS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "detected memory leaks",
                   "runtime error:", "AddressSanitizer:DEADLYSIGNAL")

KIND_BINARY = {"gateway": "pivirt-gateway", "worker": "pivirt-worker",
               "scheduler": "pivirt-scheduler", "agent": "pivirt-worker"}

# ---------------------------------------------------------------------------------------------
# ports and process bookkeeping

_handed_out = set()
_live_procs = set()
_leftover_dirs = []
_run_failed = False


def free_port():
    """A TCP port free on 127.0.0.1, drawn below the kernel's ephemeral range so that client
    sockets opened meanwhile cannot take it; never the same twice in one test process."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            high = int(f.read().split()[0]) - 1
    except (OSError, ValueError, IndexError):
        high = 32767
    high = max(high, 20001)
    for _ in range(500):
        port = random.randint(20000, high)
        if port in _handed_out:
            continue
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            s.close()
        _handed_out.add(port)
        return port
    raise RuntimeError("no free port on 127.0.0.1 between 20000 and %d" % high)


def _clean_env(extra=None):
    """The environment for a child: ours without PIVIRT_* (the programs read those as config
    keys, and a test must not depend on the caller's shell), plus EXTRA."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIVIRT_")}
    if extra:
        env.update(extra)
    return env


try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):
    _prctl = None
_PR_SET_PDEATHSIG = 1


# setpriv(1) (util-linux, essential on Debian) sets the same death signal in the child and execs
# the program, so Popen needs no preexec_fn: Python code between fork and exec can deadlock the
# child when other threads run (Python's documentation says so; a gateway restarted while client
# threads streamed once hung that way, its log empty), while a Popen without it forks and execs
# without running Python in the child.
_SETPRIV = shutil.which("setpriv")


def _die_with_parent():
    """Runs in the child between fork and exec: if the test process dies (a ctest timeout kills
    it), the child gets SIGKILL instead of living on. Linux ties this to the thread that
    started the child, so start processes from the test's main thread. Everything it needs was
    looked up before the fork: no imports or allocations here."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _tail(path, lines=40):
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return "(no log at %s)" % path
    return "\n".join(text.splitlines()[-lines:])


@atexit.register
def _at_exit():
    for p in list(_live_procs):
        p.kill9()
    for d in _leftover_dirs:
        if _run_failed:
            print("pvtest: kept %s for inspection" % d, file=sys.stderr)
        else:
            shutil.rmtree(d, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# a minimal Redis client (RESP2 over a socket)

class RedisError(Exception):
    """An error reply from Redis (-ERR ...)."""


class RespClient:
    """One connection; command() sends a command and returns the decoded reply: str for simple
    and bulk strings (bytes when not UTF-8), int, list, None; error replies raise RedisError."""

    def __init__(self, host, port, timeout=5.0, auth=None):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.buf = b""
        if auth:
            try:
                self.command("AUTH", *auth)
            except BaseException:
                self.sock.close()
                raise

    def close(self):
        self.sock.close()

    def command(self, *args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        self.sock.sendall(b"".join(out))
        return self._reply()

    def _line(self):
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("redis closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _exact(self, n):
        while len(self.buf) < n + 2:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("redis closed the connection")
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data

    @staticmethod
    def _text(b):
        try:
            return b.decode()
        except UnicodeDecodeError:
            return b

    def _reply(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RedisError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self._text(self._exact(n))
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._reply() for _ in range(n)]
        raise RedisError("unexpected reply %r" % line)


# ---------------------------------------------------------------------------------------------
# processes

class Proc:
    """One program run by a test. Output (stdout and stderr) goes to NAME.log in WORKDIR and
    accumulates over restarts."""

    def __init__(self, name, argv, workdir, env=None):
        self.name = name
        self.argv = list(argv)
        self.workdir = workdir
        self.env = env
        self.log_path = os.path.join(workdir, name + ".log")
        self.popen = None
        self.returncode = None

    @property
    def pid(self):
        return self.popen.pid if self.popen else None

    def start(self):
        if self.alive():
            raise RuntimeError("%s is already running (pid %d)" % (self.name, self.pid))
        if not os.access(self.argv[0], os.X_OK):
            raise FileNotFoundError("%s: %s is not built (PV_BUILD_DIR=%s)" %
                                    (self.name, self.argv[0], BUILD_DIR))
        with open(self.log_path, "ab") as log:
            log.write(("==== pvtest: start %s\n" % " ".join(self.argv)).encode())
            log.flush()
            if _SETPRIV:
                argv, preexec = [_SETPRIV, "--pdeathsig", "KILL", "--"] + self.argv, None
            else:
                argv, preexec = self.argv, _die_with_parent
            self.popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, env=self.env,
                                          cwd=self.workdir, preexec_fn=preexec)
        self.returncode = None
        _live_procs.add(self)
        return self

    def alive(self):
        return self.popen is not None and self.popen.poll() is None

    def send_signal(self, sig):
        if self.alive():
            self.popen.send_signal(sig)

    def stop(self, sig=signal.SIGTERM, timeout=STOP_TIMEOUT):
        """Sends SIG and waits up to TIMEOUT seconds; a process still running then gets SIGKILL.
        Returns the exit code (negative: killed by that signal, as subprocess reports it)."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                with open(self.log_path, "ab") as log:
                    log.write(b"==== pvtest: no exit %.0fs after signal %d, SIGKILL\n" % (timeout, sig))
                self.popen.kill()
                self.popen.wait()
        self.returncode = self.popen.returncode
        _live_procs.discard(self)
        return self.returncode

    def wait(self, timeout=STOP_TIMEOUT):
        """Waits for the process to exit by itself; its exit code. subprocess.TimeoutExpired
        when it still runs after TIMEOUT seconds."""
        self.returncode = self.popen.wait(timeout)
        _live_procs.discard(self)
        return self.returncode

    def kill9(self):
        return self.stop(signal.SIGKILL, timeout=10)

    def restart(self, sig=signal.SIGTERM):
        """Stops (returning that exit code) and starts again with the same arguments and log."""
        code = self.stop(sig)
        self.start()
        return code

    def log(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def tail(self, lines=40):
        return _tail(self.log_path, lines)

    def sanitizer_reports(self):
        """Lines of the log where ASan, LSan or UBSan reported a problem."""
        return [line for line in self.log().splitlines()
                if any(mark in line for mark in SANITIZER_MARKS)]

    def assert_clean(self):
        found = self.sanitizer_reports()
        if found:
            raise AssertionError("%s: sanitizer report in %s:\n  %s\n---- log tail:\n%s" %
                                 (self.name, self.log_path, "\n  ".join(found[:10]),
                                  self.tail(60)))

    def __repr__(self):
        return "Proc(%s, pid=%s)" % (self.name, self.pid)


def write_redis_acl(path, passwords):
    """Writes ops/redis.acl to PATH with each user's password of PASSWORDS ({user: password})
    appended as its SHA-256 (#hex), the form ACL files keep."""
    out = []
    with open(REDIS_ACL) as f:
        for line in f:
            line = line.rstrip("\n")
            parts = line.split()
            if len(parts) >= 2 and parts[0] == "user" and parts[1] in passwords:
                line += " #" + hashlib.sha256(passwords[parts[1]].encode()).hexdigest()
            out.append(line)
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
    os.chmod(path, 0o600)


class Redis:
    """A real redis-server on 127.0.0.1:PORT with its data in WORKDIR/redis (append-only file
    on), started from the project's ops/redis.conf.

    With acl (the default) it runs with ops/redis.acl's users, as ./ops/pivirt up does: the
    default user is off, .password is the programs' user's (REDIS_USER), and the harness's own
    connections (cmd, client, cli) log in as REDIS_ADMIN_USER. acl=False: no users, no
    password (the default user, as before the ACL).

    appendfsync None keeps ops/redis.conf's setting, what ./ops/pivirt up ships (always), so
    the tests run with the durability operators get; a test may ask for another one."""

    def __init__(self, workdir, port=None, appendfsync=None, acl=True):
        self.workdir = workdir
        self.dir = os.path.join(workdir, "redis")
        os.makedirs(self.dir, exist_ok=True)
        self.port = port or free_port()
        self.appendfsync = appendfsync
        self.proc = None
        self.acl = acl
        self.acl_path = os.path.join(self.dir, "users.acl")
        self.user = REDIS_USER if acl else ""
        self.password = os.urandom(16).hex() if acl else ""
        self.admin_password = os.urandom(16).hex() if acl else ""
        if acl:
            write_redis_acl(self.acl_path, {REDIS_USER: self.password,
                                            REDIS_ADMIN_USER: self.admin_password})

    @property
    def admin_auth(self):
        """(user, password) of the harness's connections, or None without ACL."""
        return (REDIS_ADMIN_USER, self.admin_password) if self.acl else None

    @property
    def addr(self):
        return "127.0.0.1:%d" % self.port

    def _argv(self):
        argv = [REDIS_SERVER]
        if os.path.exists(REDIS_CONF):
            # a copy: CONFIG REWRITE (a sentinel sends it with REPLICAOF) writes to the file the
            # server was started from, which must never be the repository's
            conf = os.path.join(self.workdir, "redis.conf")
            if not os.path.exists(conf):
                shutil.copyfile(REDIS_CONF, conf)
            argv.append(conf)
        argv += ["--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
                 "--appendonly", "yes", "--save", "", "--daemonize", "no", "--logfile", ""]
        if self.appendfsync:
            argv += ["--appendfsync", self.appendfsync]
        # The file's users stay; without ACL, no file (an empty aclfile: no users).
        return argv + (["--aclfile", self.acl_path] if self.acl else ["--aclfile", ""])

    def start(self, timeout=10.0):
        self.proc = Proc("redis", self._argv(), self.workdir, env=_clean_env())
        self.proc.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.proc.alive():
                raise RuntimeError("redis-server exited at start (port %d):\n%s" %
                                   (self.port, self.proc.tail()))
            if self.ping():
                return self
            time.sleep(0.05)
        raise RuntimeError("redis-server did not answer PING on port %d within %.0fs:\n%s" %
                           (self.port, timeout, self.proc.tail()))

    def ping(self):
        try:
            return self.cmd("PING") == "PONG"
        except (OSError, RedisError):
            return False

    def stop(self, timeout=STOP_TIMEOUT):
        """SIGTERM: Redis flushes the append-only file and exits. Returns the exit code."""
        return self.proc.stop(signal.SIGTERM, timeout) if self.proc else None

    def kill9(self):
        """A crash: no flush, no goodbye."""
        return self.proc.kill9() if self.proc else None

    def restart(self, timeout=10.0):
        """Starts again on the same port and directory (after stop() or kill9(); stops first
        if still running). The data comes back from the append-only file."""
        if self.proc and self.proc.alive():
            self.stop()
        return self.start(timeout)

    def alive(self):
        return bool(self.proc and self.proc.alive())

    def cmd(self, *args):
        """One command on a fresh connection; the decoded reply."""
        c = RespClient("127.0.0.1", self.port, auth=self.admin_auth)
        try:
            return c.command(*args)
        finally:
            c.close()

    def client(self):
        """A connection to keep (call .close())."""
        return RespClient("127.0.0.1", self.port, auth=self.admin_auth)

    def cli_auth_args(self):
        """redis-cli's arguments that log in as the admin user (none without ACL)."""
        if not self.acl:
            return []
        return ["--user", REDIS_ADMIN_USER, "--pass", self.admin_password, "--no-auth-warning"]

    def acl_denials(self):
        """What Redis refused the programs' user (ACL LOG entries of REDIS_USER for commands,
        keys or channels, not failed logins), as {object: count}, REDIS_EXPECTED_DENIALS left
        out. Empty without ACL."""
        if not self.acl:
            return {}
        out = {}
        for entry in self.cmd("ACL", "LOG", "128"):
            e = dict(zip(entry[0::2], entry[1::2]))
            if e.get("username") != REDIS_USER or e.get("reason") == "auth":
                continue
            if e.get("object") in REDIS_EXPECTED_DENIALS:
                continue
            out[e.get("object")] = out.get(e.get("object"), 0) + int(e.get("count", 1))
        return out

    def cli(self, *args):
        """redis-cli's output (stripped) for one command."""
        r = subprocess.run([REDIS_CLI, "-h", "127.0.0.1", "-p", str(self.port)] +
                           self.cli_auth_args() + [str(a) for a in args],
                           capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise RedisError("redis-cli %s: exit %d: %s" % (" ".join(map(str, args)), r.returncode,
                                                           r.stderr.strip()))
        return r.stdout.strip()


# ---------------------------------------------------------------------------------------------
# gRPC helpers (raw bytes: no generated stubs needed)

def unary_raw(channel_or_addr, method, body=b"", timeout=CALL_TIMEOUT, metadata=None):
    """Calls METHOD ('/pkg.Service/Method') with BODY (message bytes); returns the reply bytes.
    Raises grpc.RpcError (.code(), .details()) on a non-OK status."""
    if isinstance(channel_or_addr, str):
        with grpc.insecure_channel(channel_or_addr) as ch:
            return ch.unary_unary(method)(body, timeout=timeout, metadata=metadata)
    return channel_or_addr.unary_unary(method)(body, timeout=timeout, metadata=metadata)


def health_status(addr, service="", timeout=5.0):
    """grpc.health.v1.Health/Check on ADDR; the ServingStatus number (SERVING = 1)."""
    return _decode_health(unary_raw(addr, grpc_health.METHOD, grpc_health.encode_request(service),
                                    timeout=timeout))


def _decode_health(reply):
    try:
        return grpc_health.decode_status(reply)
    except ValueError:
        raise AssertionError("health reply is not a HealthCheckResponse: %r" % reply) from None


def health_status_on(channel, service="", timeout=5.0, metadata=None):
    """Like health_status, on an open channel (TLS, auth metadata)."""
    return _decode_health(unary_raw(channel, grpc_health.METHOD,
                                    grpc_health.encode_request(service), timeout=timeout,
                                    metadata=metadata))


def grpc_trailers(addr, path, message, timeout=20):
    """Sends one framed gRPC message to ADDR's PATH with nghttp and returns the grpc-status and
    grpc-message trailers it got (message percent-decoded). For calls that answer Eru's per-call
    codes (1021, ...): python's grpcio hangs on status codes that are not canonical."""
    with tempfile.NamedTemporaryFile(suffix=".bin") as f:
        f.write(b"\x00" + len(message).to_bytes(4, "big") + message)
        f.flush()
        out = subprocess.run(["nghttp", "-v", "-d", f.name, "-H", "content-type: application/grpc",
                              "-H", "te: trailers", "http://%s%s" % (addr, path)],
                             capture_output=True, timeout=timeout).stdout.decode("utf-8", "replace")
    found = {}
    for line in out.splitlines():
        for key in ("grpc-status", "grpc-message"):
            marker = "%s: " % key
            if marker in line and " recv " in line:
                found[key] = urllib.parse.unquote(line.split(marker, 1)[1].strip())
    return found


def buf_curl(*args, check=True, timeout=60, data=None):
    """Runs `buf curl ARGS`; returns (rc, stdout, stderr). With check, a non-zero exit raises
    AssertionError with buf's output. DATA is sent on stdin (use '-d @-')."""
    if not os.access(BUF, os.X_OK):
        raise AssertionError("buf not found at %s: set PV_BUF or run ./ops/pivirt test "
                             "(it installs @bufbuild/buf into .tools)" % BUF)
    argv = [BUF, "curl"] + [str(a) for a in args]
    try:
        r = subprocess.run(argv, input=data, capture_output=True, text=True, timeout=timeout,
                           env=_clean_env())
    except subprocess.TimeoutExpired as e:
        raise AssertionError("buf curl timed out after %ss: %s" % (timeout, " ".join(argv))) from e
    if check and r.returncode != 0:
        raise AssertionError("buf curl exited %d: %s\nstdout: %s\nstderr: %s" %
                             (r.returncode, " ".join(argv), r.stdout, r.stderr))
    return r.returncode, r.stdout, r.stderr


# ---------------------------------------------------------------------------------------------
# the stack

def _nest(flat_or_nested):
    """{'gateway.threads': 4} and {'gateway': {'threads': 4}} both become the nested form."""
    out = {}
    for key, value in flat_or_nested.items():
        if isinstance(value, dict):
            value = _nest(value)
        parts = key.split(".")
        d = out
        for p in parts[:-1]:
            d = d.setdefault(p, {})
        if isinstance(value, dict) and isinstance(d.get(parts[-1]), dict):
            _merge(d[parts[-1]], value)
        else:
            d[parts[-1]] = value
    return out


def _merge(base, over):
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _merge(base[k], v)
        else:
            base[k] = v
    return base


class Gateway:
    """A gateway of a Stack: .proc, .addrs ('127.0.0.1:PORT', two of them), .config_path.
    stop() stops it alone (its exit code); Stack.stop() still checks that code and its log."""

    def __init__(self, proc, addrs, config_path):
        self.proc = proc
        self.addrs = addrs
        self.config_path = config_path

    def stop(self, sig=signal.SIGTERM, timeout=STOP_TIMEOUT):
        return self.proc.stop(sig, timeout)

    def start(self):
        return self.proc.start()


class Stack:
    """Redis plus the programs of a test, each configured like the real stack but on free
    ports, a temporary directory and the key prefix 'pvt<pid>:' (libvirt names storage pools
    after the prefix, and the system's libvirtd is shared by tests running side by side).

    gateways, workers, schedulers: how many of each. agents: node agents, each a node name
    (pod 'local'), a (node, pod) pair or {'node': ..., 'pod': ..., 'endpoint': ..., 'set':
    {key: value}} (the agent's engine, process:// by default; settings of that agent alone,
    as --set KEY=VALUE). config: overrides merged
    into the config file (nested objects or dotted keys). redis_appendfsync: Redis's
    appendfsync (None: ops/redis.conf's).

    Start waits until every gateway address reports SERVING and every other process has its
    presence key in Redis. stop() SIGTERMs everything (agents, workers, schedulers, gateways,
    then Redis), requires exit code 0 from the gateways, checks every log for sanitizer reports
    and removes the temporary directory; the directory is kept (and its path printed) when
    something failed.

    Start it with start() (or start=True, or a `with` block, which starts it if needed and
    stops it at the end). Gateways with auth or TLS: start(auth=(username, password)),
    start(tls_root=PEM bytes) and, for mutual TLS, start(tls_client=(certificate PEM bytes,
    key PEM bytes)) make the readiness checks (and channel()) use them."""

    PREFIX = "pvt%d:" % os.getpid()

    def __init__(self, gateways=1, workers=0, schedulers=0, agents=(), config=None,
                 start=False, env=None, redis_acl=True, redis_appendfsync=None):
        self.tmpdir = tempfile.mkdtemp(prefix="pvtest-")
        # searchable (not listable) by others: the workloads run as uids of their own and reach
        # their trees through it
        os.chmod(self.tmpdir, 0o711)
        self.data_dir = os.path.join(self.tmpdir, "data")
        os.makedirs(self.data_dir)
        self.prefix = self.PREFIX
        self.env = _clean_env(env)
        self.redis = Redis(self.tmpdir, acl=redis_acl, appendfsync=redis_appendfsync)
        self.failed = False
        self.started = False
        self.stopped = False
        self.auth = None
        self.tls_root = None
        self.tls_client = None
        self.tls_name = "localhost"
        self._channels = []
        self.config = _merge({
            "data_dir": self.data_dir,
            "log": {"level": "info"},
            "redis": {"addr": self.redis.addr, "prefix": self.prefix,
                      "username": self.redis.user, "password": self.redis.password},
            "test_operations": True,
        }, _nest(config or {}))
        self.config_path = self._write_config("config.json", self.config)

        self.gateways = []
        for i in range(gateways):
            addrs = ["127.0.0.1:%d" % free_port(), "127.0.0.1:%d" % free_port()]
            cfg = _merge(json.loads(json.dumps(self.config)), {"gateway": {"listen": addrs}})
            path = self._write_config("gateway-%d.json" % i, cfg)
            proc = self._proc("gateway-%d" % i, "gateway", ["--config", path])
            self.gateways.append(Gateway(proc, addrs, path))
        self.schedulers = [self._proc("scheduler-%d" % i, "scheduler", ["--config", self.config_path])
                           for i in range(schedulers)]
        self.workers = [self._proc("worker-%d" % i, "worker", ["--config", self.config_path])
                        for i in range(workers)]
        self.agents = []
        self.agent_nodes, self.agent_pods = [], []
        for spec in agents:
            node, pod = self._agent_spec(spec)
            self.agent_nodes.append(node)
            self.agent_pods.append(pod)
            extra = []
            if isinstance(spec, dict) and spec.get("endpoint"):
                extra = ["--set", "worker.endpoint=" + spec["endpoint"]]
            for key, value in (spec.get("set", {}) if isinstance(spec, dict) else {}).items():
                extra += ["--set", "%s=%s" % (key, value)]  # this agent's own settings
            self.agents.append(self._proc("agent-%s" % node, "agent",
                                          ["--config", self.config_path,
                                           "--set", "worker.node=" + node,
                                           "--set", "worker.pod=" + pod] + extra))
        if start:
            self.start()

    # -- construction helpers

    @staticmethod
    def _agent_spec(spec):
        if isinstance(spec, str):
            return spec, "local"
        if isinstance(spec, dict):
            return spec["node"], spec.get("pod", "local")
        node, pod = spec
        return node, pod

    def _write_config(self, name, cfg):
        path = os.path.join(self.tmpdir, name)
        with open(path, "w") as f:
            json.dump(cfg, f, indent=2)
        return path

    def _proc(self, name, kind, args):
        p = Proc(name, [os.path.join(BIN_DIR, KIND_BINARY[kind])] + args, self.tmpdir, self.env)
        p.kind = kind
        return p

    @property
    def procs(self):
        """Every program (not Redis), in start order."""
        return [g.proc for g in self.gateways] + self.schedulers + self.workers + self.agents

    # -- start and readiness

    def start(self, timeout=START_TIMEOUT, auth=None, tls_root=None, tls_name="localhost",
              tls_client=None):
        """Starts Redis and every process not running and waits until each answers. AUTH
        (username, password) is sent by the health checks; TLS_ROOT (PEM bytes) makes them and
        channel() use TLS, verifying the server as TLS_NAME; TLS_CLIENT (certificate PEM, key
        PEM) is the client certificate they show (mutual TLS)."""
        if auth is not None:
            self.auth = auth
        if tls_client is not None:
            self.tls_client = tls_client
        if tls_root is not None:
            self.tls_root = tls_root
            self.tls_name = tls_name
        self.started = True
        self.stopped = False
        try:
            if not self.redis.alive():
                self.redis.start()
            for p in self.procs:
                if not p.alive():
                    p.start()
            self.wait_ready(timeout=timeout)
        except BaseException:
            self.failed = True
            self.stop(check=False)
            raise
        return self

    def wait_ready(self, procs=None, timeout=START_TIMEOUT):
        """Waits until each of PROCS (default all) answers: health SERVING on every address
        of a gateway, a presence key naming its pid for the others."""
        pending = list(procs if procs is not None else self.procs)
        deadline = time.monotonic() + timeout
        while pending:
            still = []
            for p in pending:
                if not p.alive():
                    raise AssertionError("%s exited during start with code %s:\n%s" %
                                         (p.name, p.popen.poll() if p.popen else None, p.tail()))
                if not self.answers(p):
                    still.append(p)
            pending = still
            if not pending:
                return
            if time.monotonic() >= deadline:
                p = pending[0]
                raise AssertionError("%s did not answer within %.0fs (waiting for %s); log %s:\n%s" %
                                     (p.name, timeout, ", ".join(q.name for q in pending),
                                      p.log_path, p.tail()))
            time.sleep(0.1)

    def wait_alive(self, nodes, timeout=START_TIMEOUT):
        """Waits until each of NODES is alive (its alive key set by its agent's beat). Ready
        (wait_ready) means registered: the beat that registers a node sets it alive only after
        the engine's info and a ping of its daemon, which a busy machine can take seconds over,
        and a plan in between finds no node to place on."""
        deadline = time.monotonic() + timeout
        for node in nodes:
            while not self.redis.cmd("EXISTS", self.key("{reg}:alive:" + node)):
                if time.monotonic() >= deadline:
                    raise AssertionError("node %s not alive within %.0fs" % (node, timeout))
                time.sleep(0.05)

    def answers(self, p):
        if p.kind == "gateway":
            gw = next(g for g in self.gateways if g.proc is p)
            return all(self._serving(a) for a in gw.addrs)
        if self.presence(p) is None:
            return False
        # an agent's presence comes before its first beat registers its node (and pod): a test
        # that calls at once must find them (an agent without a pod registers nothing)
        if p.kind != "agent" or not self.agent_pods[self.agents.index(p)]:
            return True
        return self._registered(self.agent_nodes[self.agents.index(p)])

    def _registered(self, node):
        try:
            return self.redis.cmd("HEXISTS", self.prefix + "{reg}:nodes", node) == 1
        except (RedisError, OSError):
            return False

    def _serving(self, addr):
        md = [(self.auth[0], self.auth[1])] if self.auth else None
        ch = self._open_channel(addr)
        try:
            return health_status_on(ch, timeout=1.0, metadata=md) == SERVING
        except grpc.RpcError:
            return False
        finally:
            ch.close()

    def _open_channel(self, addr):
        if self.tls_root is None:
            return grpc.insecure_channel(addr)
        cert, key = self.tls_client if self.tls_client else (None, None)
        creds = grpc.ssl_channel_credentials(root_certificates=self.tls_root, private_key=key,
                                             certificate_chain=cert)
        return grpc.secure_channel(addr, creds,
                                   options=[("grpc.ssl_target_name_override", self.tls_name)])

    def presence(self, p):
        """The presence record (dict) of process P whose pid is P's, or None."""
        if p.kind == "agent":
            node = self.agent_nodes[self.agents.index(p)]
            keys = ["%spresence:agent:%s" % (self.prefix, node)]
        else:
            keys = self.scan("%spresence:%s:*" % (self.prefix, p.kind))
        for key in keys:
            try:
                raw = self.redis.cmd("GET", key)
            except RedisError:
                continue  # not a string: some other record under the same name space
            except OSError:
                return None
            if not raw:
                continue
            try:
                rec = json.loads(raw)
            except ValueError:
                continue
            if isinstance(rec, dict) and rec.get("pid") == p.pid:
                return rec
        return None

    def scan(self, pattern):
        """Every key matching PATTERN (SCAN, so safe on a big keyspace)."""
        keys, cursor = [], "0"
        try:
            while True:
                cursor, batch = self.redis.cmd("SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
                keys.extend(batch)
                if cursor == "0":
                    return keys
        except (OSError, RedisError):
            return keys

    # -- clients

    def channel(self, i=0, addr=0):
        """A gRPC channel to gateway I (its address number ADDR): plaintext, or TLS when the
        stack was started with tls_root. No auth metadata is added. Closed by stop()."""
        ch = self._open_channel(self.gateways[i].addrs[addr])
        self._channels.append(ch)
        return ch

    def url(self, i=0, path="", addr=0):
        """http://127.0.0.1:PORT[PATH] of gateway I, for buf curl."""
        return "http://%s%s" % (self.gateways[i].addrs[addr], path)

    def buf_curl(self, *args, check=True, timeout=60, data=None):
        """buf curl with BUF_GRPC prepended."""
        return buf_curl(*(BUF_GRPC + tuple(args)), check=check, timeout=timeout, data=data)

    def delete_storage(self, strict=True):
        """Deletes every volume and pool through StorageService (their libvirt pools go with
        them: the system libvirtd outlives the stack). strict: a refusal raises; else it is
        passed over (a test that left something behind on purpose)."""
        from pivirt.storage.v1 import storage_pb2 as S, storage_pb2_grpc
        st = storage_pb2_grpc.StorageServiceStub(self.channel(0))
        for p in st.ListPools(S.ListPoolsRequest(), timeout=10):
            for v in st.ListVolumes(S.ListVolumesRequest(pool=p.name), timeout=10):
                self._tolerate(strict, st.DeleteVolume, S.DeleteVolumeRequest(id=v.id))
            self._tolerate(strict, st.DeletePool, S.DeletePoolRequest(name=p.name))

    @staticmethod
    def _tolerate(strict, fn, req):
        try:
            fn(req, timeout=30)
        except grpc.RpcError:
            if strict:
                raise

    def redis_cli(self, *args):
        """redis-cli's output for one command on the stack's Redis."""
        return self.redis.cli(*args)

    def key(self, suffix):
        """A key name with the stack's prefix."""
        return self.prefix + suffix

    # -- stop

    def stop(self, check=True):
        """Stops everything. With CHECK: every gateway must exit 0 and no log may hold a
        sanitizer report, else AssertionError (after everything is stopped)."""
        if self.stopped:
            return
        self.stopped = True
        for ch in self._channels:
            ch.close()
        self._channels = []
        problems = []
        for p in reversed(self.procs):
            if p.popen is None:
                continue
            code = p.stop()
            if check and p.kind == "gateway" and code != 0:
                problems.append("%s exited with code %s after SIGTERM (want 0)" % (p.name, code))
            elif code not in (0, None):
                print("pvtest: note: %s exited with code %s" % (p.name, code), file=sys.stderr)
        if check and self.redis.alive():
            # Every command the programs sent was one their ACL user may run: the whole suite
            # keeps ops/redis.acl's list complete.
            try:
                denied = self.redis.acl_denials()
            except (OSError, RedisError) as e:
                denied = {}
                print("pvtest: note: ACL LOG unreadable: %s" % e, file=sys.stderr)
            if denied:
                problems.append("redis refused the %s user (ops/redis.acl lacks them): %s" %
                                (REDIS_USER, ", ".join("%s x%d" % kv for kv in sorted(denied.items()))))
        self.redis.stop()
        if check:
            for p in self.procs:
                if p.popen is None:
                    continue
                try:
                    p.assert_clean()
                except AssertionError as e:
                    problems.append(str(e))
        if problems:
            self.failed = True
        self._cleanup()
        if problems:
            raise AssertionError("\n".join(problems) + "\n(logs kept in %s)" % self.tmpdir)

    def _cleanup(self):
        if self.failed:
            print("pvtest: test stack kept in %s" % self.tmpdir, file=sys.stderr)
            return
        # Removed at exit unless the run failed: a later test failure may want these logs.
        _leftover_dirs.append(self.tmpdir)

    def __enter__(self):
        if not self.started:
            self.start()
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.failed = True
            self.stop(check=False)
            return False
        self.stop()
        return False

    # -- audit

    def check(self, confirm_ms=1000, grace_ms=None, raw=False):
        """Runs pivirt-check (./ops/pivirt check) against the stack's config and returns its
        differences as lines "KIND subject: detail" (sorted; [] when the state is clean), or with
        RAW its JSON report. Waits for nothing: call it once the system should have settled.
        An audit that could not run (exit 2, a sanitizer report) raises AssertionError."""
        argv = [os.path.join(BIN_DIR, "pivirt-check"), "--config", self.config_path, "-o", "json",
                "--confirm-ms", str(confirm_ms)]
        if grace_ms is not None:
            argv += ["--grace-ms", str(grace_ms)]
        p = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=120)
        if p.returncode not in (0, 1) or any(m in p.stderr for m in SANITIZER_MARKS):
            raise AssertionError("pivirt-check exited %d:\n%s%s" % (p.returncode, p.stdout,
                                                                    p.stderr))
        report = json.loads(p.stdout)
        self.last_check = report
        if (p.returncode == 1) != (report["total"] > 0):
            raise AssertionError("pivirt-check exit code %d does not match its report: %s" %
                                 (p.returncode, p.stdout))
        if raw:
            return report
        return ["%s %s: %s" % (d["kind"], d["subject"], d["detail"])
                for d in report["differences"]]


# ---------------------------------------------------------------------------------------------
# running a test file

def main():
    """Runs the unittest cases of __main__; exits non-zero when any failed or none ran."""
    global _run_failed
    prog = unittest.main(module="__main__", exit=False, verbosity=2)
    result = prog.result
    ok = result.wasSuccessful() and result.testsRun > 0
    if result.testsRun == 0:
        print("pvtest: no test ran", file=sys.stderr)
    if not ok:
        _run_failed = True
    sys.exit(0 if ok else 1)


LIBVIRT_SOCK = "/run/libvirt/libvirt-sock"


def ensure_libvirtd(timeout=20.0):
    """Makes sure a system libvirtd answers (DIR pools need the real one): starts it, with the
    libvirt-qemu user it runs qemu-img as, when none runs. Returns an error text, or None."""
    if os.path.exists(LIBVIRT_SOCK) and subprocess.run(
            ["virsh", "-c", "qemu:///system", "pool-list", "--all"], capture_output=True).returncode == 0:
        return None
    libvirtd = shutil.which("libvirtd") or "/usr/sbin/libvirtd"
    if not os.path.exists(libvirtd):
        return "libvirtd is not installed (./ops/pivirt installs libvirt-daemon)"
    if subprocess.run(["getent", "passwd", "libvirt-qemu"], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell",
                        "/usr/sbin/nologin", "libvirt-qemu"], capture_output=True)
    for d in ("/var/log/libvirt", "/var/lib/libvirt", "/run/libvirt"):
        os.makedirs(d, exist_ok=True)
    subprocess.run([libvirtd, "-d"], capture_output=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(LIBVIRT_SOCK) and subprocess.run(
                ["virsh", "-c", "qemu:///system", "pool-list", "--all"], capture_output=True).returncode == 0:
            return None
        time.sleep(0.2)
    return "libvirtd did not answer within %.0f s" % timeout


def write_script_image(data_dir, name, tag, script):
    """An image the process engine runs: a tar archive holding run.sh (SCRIPT, the text after
    its #!/bin/sh line), written into the agents' image store as <data_dir>/images/NAME/TAG.tar."""
    path = os.path.join(data_dir, "images", name, tag + ".tar")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tempfile.TemporaryDirectory() as root:
        run = os.path.join(root, "run.sh")
        with open(run, "w") as f:
            f.write("#!/bin/sh\n" + script)
        os.chmod(run, 0o755)
        with tarfile.open(path, "w") as t:
            t.add(run, arcname="run.sh")
    return path


def make_tls_cert(directory=None):
    """A self-signed certificate for localhost: (key path, certificate path, certificate
    bytes to trust as the root)."""
    directory = directory or tempfile.mkdtemp(prefix="pv-tls-")
    key, crt = os.path.join(directory, "key.pem"), os.path.join(directory, "crt.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
                    "-keyout", key, "-out", crt], check=True, capture_output=True)
    with open(crt, "rb") as f:
        return key, crt, f.read()


# ---------------------------------------------------------------------------------------------
# stacks that ./ops/pivirt itself starts

def free_port_block(n):
    """The first of N consecutive ports all free on 127.0.0.1 (up's metrics ports: the gateway's
    and the next three)."""
    for _ in range(50):
        base = free_port()
        taken = []
        try:
            for port in range(base, base + n):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                taken.append(s)
                s.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for s in taken:
                s.close()
        _handed_out.update(range(base, base + n))
        return base
    raise RuntimeError("no %d consecutive free ports on 127.0.0.1" % n)


def libvirt_pool_name(prefix, name):
    """The libvirt name a node agent gives pool NAME of a system with Redis key PREFIX (every
    character but letters and digits a '-', one '-' before the name: pv: -> pv-default)."""
    base = "".join(c if c.isalnum() else "-" for c in prefix)
    return (base if base.endswith("-") else base + "-") + name


def virsh(*args, check=True):
    """virsh on the system libvirtd: its stdout (a failure raises with CHECK, else None)."""
    r = subprocess.run(["virsh", "-c", "qemu:///system"] + list(args), capture_output=True,
                       text=True, timeout=60)
    if r.returncode != 0:
        if check:
            raise AssertionError("virsh %s: %s" % (" ".join(args), r.stderr.strip()))
        return None
    return r.stdout


class OpsStack:
    """A whole local stack as an operator gets it: `./ops/pivirt up` in a data directory of its
    own (temporary, 0711 so the workloads' uids reach their trees), every port moved through
    the environment (PIVIRT_REDIS_PORT, PIVIRT_GATEWAY_LISTEN, PIVIRT_METRICS_PORT), a key
    prefix of its own (PIVIRT_KEY_PREFIX: the libvirt pools are named after it), and the test
    build's programs (PIVIRT_BIN_DIR, so up builds nothing). PIVIRT_ENDPOINT points pvcli at it.

        st = OpsStack("a")
        st.pivirt("up")          # a CompletedProcess (text); st.up() asserts it succeeded
        st.storage.ListPools(...)
        st.close()               # down, the libvirt pools of its prefix undefined, files gone

    ROOT is the tree whose ops/pivirt runs (the repository's by default)."""

    def __init__(self, tag, root=None):
        self.tmp = tempfile.mkdtemp(prefix="pvtest-ops-%s-" % tag)
        os.chmod(self.tmp, 0o711)
        self.root = root or SOURCE_DIR
        self.data = os.path.join(self.tmp, "data")
        self.addr = "127.0.0.1:%d" % free_port()
        self.prefix = "pvt%d%s:" % (os.getpid(), tag)
        self.redis_port = free_port()
        self.env = _clean_env({
            "PIVIRT_DATA_DIR": self.data, "PIVIRT_REDIS_PORT": str(self.redis_port),
            "PIVIRT_GATEWAY_LISTEN": self.addr, "PIVIRT_METRICS_PORT": str(free_port_block(4)),
            "PIVIRT_KEY_PREFIX": self.prefix, "PIVIRT_BIN_DIR": BIN_DIR,
            "PIVIRT_ENDPOINT": self.addr})
        self.failed = False
        self._channel = None

    def pivirt(self, *args, timeout=300):
        """./ops/pivirt ARGS with the stack's environment, from the root of its tree."""
        return subprocess.run([os.path.join(self.root, "ops", "pivirt")] + list(args),
                              cwd=self.root, env=self.env, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def up(self):
        r = self.pivirt("up")
        if r.returncode != 0:
            self.failed = True
            raise AssertionError("./ops/pivirt up exited %d:\n%s\n%s" %
                                 (r.returncode, r.stdout, r.stderr[-4000:]))
        return r

    @property
    def storage(self):
        """A StorageService stub on the stack's gateway."""
        from pivirt.storage.v1 import storage_pb2_grpc
        if self._channel is None:
            self._channel = grpc.insecure_channel(self.addr)
        return storage_pb2_grpc.StorageServiceStub(self._channel)

    def libvirt_pool(self, name):
        """The libvirt name of the stack's pool NAME."""
        return libvirt_pool_name(self.prefix, name)

    def pids(self):
        """{process name: pid} from up's pid files."""
        out = {}
        run = os.path.join(self.data, "run")
        for f in os.listdir(run) if os.path.isdir(run) else []:
            if f.endswith(".pid"):
                with open(os.path.join(run, f)) as fh:
                    out[f[:-4]] = int(fh.read().strip())
        return out

    def processes(self):
        """["pid command line"] of every process that runs from the stack's files: its
        daemons (their arguments name the data directory) and its workloads (their working
        directory is in it)."""
        found = []
        for pid in (p for p in os.listdir("/proc") if p.isdigit()):
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    argv = f.read().decode("utf-8", "replace").replace("\0", " ").strip()
                cwd = os.readlink("/proc/%s/cwd" % pid)
            except OSError:
                continue  # gone meanwhile, or a kernel thread
            if self.data in argv or (cwd + "/").startswith(self.data + "/"):
                found.append("%s %s" % (pid, argv))
        return found

    def logs_with_sanitizer_reports(self):
        """The names of the logs under the data directory that hold a sanitizer report."""
        logdir = os.path.join(self.data, "logs")
        found = []
        for name in sorted(os.listdir(logdir)) if os.path.isdir(logdir) else []:
            with open(os.path.join(logdir, name), errors="replace") as f:
                text = f.read()
            if any(m in text for m in SANITIZER_MARKS):
                found.append(name)
        return found

    def close(self):
        """down, then the libvirt definitions of the stack's pools (the system libvirtd
        outlives it), then its files unless a test failed (then they are kept and named)."""
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        down = self.pivirt("down", timeout=120)
        lv_prefix = self.libvirt_pool("")
        for name in (virsh("pool-list", "--all", "--name", check=False) or "").split():
            if name.startswith(lv_prefix):
                virsh("pool-destroy", name, check=False)
                virsh("pool-undefine", name, check=False)
        if self.failed or down.returncode != 0:
            print("pvtest: kept %s (down exited %d: %s)" % (self.tmp, down.returncode,
                                                            down.stderr[-2000:]), file=sys.stderr)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)
        return down


def proc_state(pid):
    """The state letter of /proc/PID/stat, or "" when there is no such process."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def proc_stopped(pid):
    """Whether pid has taken a SIGSTOP, as the process engine judges it (wk_proc.h): state T,
    or D over a child of its own in T (a vfork parent whose child stopped before its exec)."""
    s = proc_state(pid)
    if s in ("", "T", "t"):
        return True
    if s != "D":
        return False
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
            children = [int(c) for c in f.read().split()]
    except OSError:
        return False
    return any(proc_state(c) in ("T", "t") for c in children)
# ---------------------------------------------------------------------------------------------
# a private Docker daemon and registry (the docker engine's tests)

DOCKERD = shutil.which("dockerd") or "/usr/sbin/dockerd"
DOCKER_REGISTRY = shutil.which("docker-registry") or "/usr/bin/docker-registry"
BUSYBOX = shutil.which("busybox") or "/bin/busybox"


def docker_missing():
    """Why the docker tests cannot run here (None when they can): Debian's docker.io and
    docker-registry and a static busybox, which ./ops/pivirt installs."""
    for path, pkg in ((DOCKERD, "docker.io"), (DOCKER_REGISTRY, "docker-registry"),
                      (BUSYBOX, "busybox-static")):
        if not os.access(path, os.X_OK):
            return "%s is not installed (%s)" % (path, pkg)
    if os.geteuid() != 0:
        return "dockerd needs root"
    return None


class _StartStop:
    """`with X() as x:` for the fixtures below: start() on the way in, stop() on the way out."""

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False


class DockerDaemon(_StartStop):
    """A dockerd of the test's own: its socket, data root, exec root and pid file in a
    temporary directory, no iptables and no default bridge, overlay2; never the system's.

        with pvtest.DockerDaemon() as dk:
            dk.endpoint                    # unix:///tmp/.../docker.sock
            dk.api("GET", "/containers/json?all=1")
            dk.import_busybox("demo:1")    # an image of busybox-static, made here

    stop() SIGTERMs it (its containers come back Exited) and removes the directory. The API
    is spoken over its socket with the standard library (HTTP/1.1, one request per
    connection).

    tls=True also listens on tcp://127.0.0.1:PORT (tcp_endpoint) with --tlsverify: a CA of its
    own signed the daemon's certificate (for IP 127.0.0.1) and a client's, whose files are
    ca_pem, cert_pem and key_pem.

    cpus="0" runs it on those cores alone (taskset -c): a daemon whose machine looks smaller
    than the agent's."""

    def __init__(self, tls=False, cpus=None):
        # short: a unix socket path has at most 107 bytes
        self.dir = tempfile.mkdtemp(prefix="pvdk-", dir="/tmp")
        self.sock = os.path.join(self.dir, "docker.sock")
        self.endpoint = "unix://" + self.sock
        argv = [DOCKERD, "--host", self.endpoint,
                "--data-root", os.path.join(self.dir, "data"),
                "--exec-root", os.path.join(self.dir, "exec"),
                "--pidfile", os.path.join(self.dir, "docker.pid"),
                "--iptables=false", "--bridge=none",
                "--storage-driver=overlay2", "--log-level=warn"]
        self.tcp_endpoint = None
        if tls:
            self.tcp_endpoint = "tcp://127.0.0.1:%d" % free_port()
            self._make_certs()
            argv += ["--host", self.tcp_endpoint, "--tlsverify", "--tlscacert", self.ca_pem,
                     "--tlscert", os.path.join(self.dir, "server.pem"),
                     "--tlskey", os.path.join(self.dir, "server-key.pem")]
        if cpus is not None:  # its GET /info then says NCPU = how many cores that is
            argv = ["/usr/bin/taskset", "-c", cpus] + argv
        self.proc = Proc("dockerd", argv, self.dir, _clean_env())

    def _make_certs(self):
        d = self.dir
        self.ca_pem = os.path.join(d, "ca.pem")
        self.cert_pem = os.path.join(d, "cert.pem")
        self.key_pem = os.path.join(d, "key.pem")

        def run(*args):
            subprocess.run(["openssl"] + list(args), check=True, capture_output=True, cwd=d)

        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        run("req", "-x509", *ec, "-days", "1", "-subj", "/CN=pvtest-ca", "-keyout",
            "ca-key.pem", "-out", "ca.pem")
        for name, subj, ext in (("server", "/CN=127.0.0.1",
                                 "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
                                ("client", "/CN=pvtest-client", "extendedKeyUsage=clientAuth\n")):
            key = "server-key.pem" if name == "server" else "key.pem"
            crt = "server.pem" if name == "server" else "cert.pem"
            with open(os.path.join(d, name + ".ext"), "w") as f:
                f.write(ext)
            run("req", *ec, "-subj", subj, "-keyout", key, "-out", name + ".csr")
            run("x509", "-req", "-in", name + ".csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem",
                "-CAcreateserial", "-days", "1", "-out", crt, "-extfile", name + ".ext")

    def start(self, timeout=30):
        self.proc.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.proc.alive():
                raise AssertionError("dockerd exited:\n%s" % self.proc.tail())
            try:
                if self.raw("GET", "/_ping")[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError("dockerd did not answer within %.0fs:\n%s" % (timeout,
                                                                           self.proc.tail()))

    def raw(self, method, path, body=None, headers=None, timeout=120):
        """(status, body bytes) of one request on the daemon's socket."""
        import http.client

        class _Conn(http.client.HTTPConnection):
            def connect(conn):
                conn.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                conn.sock.settimeout(timeout)
                conn.sock.connect(self.sock)

        c = _Conn("localhost", timeout=timeout)
        try:
            hdrs = dict(headers or {})
            if isinstance(body, (dict, list)):
                body = json.dumps(body).encode()
                hdrs.setdefault("Content-Type", "application/json")
            c.request(method, "/v1.41" + path, body=body, headers=hdrs)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def api(self, method, path, body=None, headers=None, ok=(200, 201, 204, 304)):
        """The JSON answer of a request (None when empty); another status raises."""
        status, data = self.raw(method, path, body, headers)
        if status not in ok:
            raise AssertionError("%s %s: HTTP %d %s" % (method, path, status, data[:500]))
        if not data:
            return None
        try:
            return json.loads(data)
        except ValueError:
            return data

    def containers(self, label="pivirt.id"):
        """Every container (running or not) with LABEL."""
        q = urllib.parse.quote(json.dumps({"label": [label]}))
        return self.api("GET", "/containers/json?all=1&filters=" + q)

    def inspect(self, cid):
        """GET /containers/{cid}/json, or None when there is no such container."""
        status, data = self.raw("GET", "/containers/%s/json" % cid)
        return json.loads(data) if status == 200 else None

    def import_busybox(self, ref):
        """Imports an image REF ("name:tag") whose root is busybox-static with a link for each
        of its applets in /bin (docker import of a tar made here): sh, sleep, cat, ..."""
        import io
        import tarfile
        buf = io.BytesIO()
        applets = subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True,
                                 check=True).stdout.split()
        with tarfile.open(fileobj=buf, mode="w") as t:
            for d in ("bin", "tmp", "etc", "root", "proc", "sys", "dev"):
                info = tarfile.TarInfo(d)
                info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755
                t.addfile(info)
            t.add(BUSYBOX, arcname="bin/busybox")
            for a in applets:
                if a == "busybox":
                    continue
                info = tarfile.TarInfo("bin/" + a)
                info.type, info.linkname = tarfile.SYMTYPE, "busybox"
                t.addfile(info)
            passwd = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n"
            group = b"root:x:0:\nnobody:x:65534:\n"
            for name, data in (("etc/passwd", passwd), ("etc/group", group)):
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(data), 0o644
                t.addfile(info, io.BytesIO(data))
        repo, tag = ref.rsplit(":", 1)
        out = self.api("POST", "/images/create?fromSrc=-&repo=%s&tag=%s" % (
            urllib.parse.quote(repo), urllib.parse.quote(tag)), body=buf.getvalue(),
            headers={"Content-Type": "application/x-tar"})
        if b"error" in (out if isinstance(out, bytes) else json.dumps(out).encode()):
            raise AssertionError("import %s: %s" % (ref, out))
        return ref

    def bridges(self):
        """The host interfaces of the daemon's bridge networks (br-<id>): a daemon that stops
        leaves them behind, and a leftover one with the same subnet takes the route to it."""
        try:
            nets = self.api("GET", "/networks") if self.proc.alive() else []
        except (OSError, AssertionError):
            nets = []
        return ["br-" + n["Id"][:12] for n in nets
                if n.get("Driver") == "bridge" and n.get("Name") != "bridge"]

    def stop(self):
        """SIGTERM (containers stop with it), then its bridge interfaces and the directory go
        (its overlay mounts first: a daemon killed hard may leave some)."""
        bridges = self.bridges()
        code = self.proc.stop(timeout=30)
        for br in bridges:
            subprocess.run(["ip", "link", "delete", br], capture_output=True)
        subprocess.run(["sh", "-c", "grep -o ' %s[^ ]*' /proc/mounts | sort -r | "
                        "xargs -r -n1 umount -l" % self.dir], capture_output=True)
        if code in (0, None):
            shutil.rmtree(self.dir, ignore_errors=True)
        else:
            print("pvtest: dockerd exited %s; kept %s" % (code, self.dir), file=sys.stderr)
        return code


class Registry(_StartStop):
    """Debian's docker-registry (distribution 2.8) on a free loopback port with a config and a
    storage directory of its own (deletes enabled); dockerd trusts 127.0.0.0/8 without TLS.
    auth=(user, password) turns on htpasswd (bcrypt, cost 4: dockerd authenticates every
    request). addr is "127.0.0.1:PORT", the hub of image references."""

    def __init__(self, auth=None):
        self.dir = tempfile.mkdtemp(prefix="pvreg-")
        self.port = free_port()
        self.addr = "127.0.0.1:%d" % self.port
        self.auth = auth
        conf = ["version: 0.1", "log:", "  level: warn", "storage:", "  filesystem:",
                "    rootdirectory: %s" % os.path.join(self.dir, "data"), "  delete:",
                "    enabled: true", "http:", "  addr: %s" % self.addr]
        if auth:
            import crypt
            with open(os.path.join(self.dir, "htpasswd"), "w") as f:
                f.write("%s:%s\n" % (auth[0], crypt.crypt(
                    auth[1], crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16))))
            conf += ["auth:", "  htpasswd:", "    realm: pvtest",
                     "    path: %s" % os.path.join(self.dir, "htpasswd")]
        self.config = os.path.join(self.dir, "config.yml")
        with open(self.config, "w") as f:
            f.write("\n".join(conf) + "\n")
        self.proc = Proc("registry", [DOCKER_REGISTRY, "serve", self.config], self.dir,
                         _clean_env())

    def start(self, timeout=20):
        import urllib.error
        import urllib.request
        self.proc.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.proc.alive():
                raise AssertionError("docker-registry exited:\n%s" % self.proc.tail())
            try:
                urllib.request.urlopen("http://%s/v2/" % self.addr, timeout=2)
                return self
            except urllib.error.HTTPError:
                return self  # 401 with auth: it answers
            except OSError:
                time.sleep(0.05)
        raise AssertionError("docker-registry did not answer within %.0fs" % timeout)

    def tags(self, name):
        """The tags the registry holds of repository NAME ([] when none)."""
        import base64
        import urllib.error
        import urllib.request
        req = urllib.request.Request("http://%s/v2/%s/tags/list" % (self.addr, name))
        if self.auth:
            req.add_header("Authorization", "Basic " + base64.b64encode(
                ("%s:%s" % self.auth).encode()).decode())
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return sorted(json.loads(r.read()).get("tags") or [])
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return []
            raise

    def stop(self):
        code = self.proc.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
        return code


class DockerSetup:
    """What a docker test module runs on: its dockerd (busybox-static imported as demo:1), its
    registry if asked for, and a Stack of one gateway, ops worker and scheduler with AGENTS
    (made by agents(daemon), since their endpoints name the daemon) and CONFIG (config(daemon)
    when callable). registry=(username, password) makes the registry ask for them (htpasswd)
    and gives them to the stack as registry.auths; daemon_cpus: DockerDaemon's cpus; alive: the
    nodes to wait alive for (Stack.wait_alive). Raises unittest.SkipTest where
    docker_missing() says why. stop() stops it all, whatever failed first.

        def setUpModule():
            global _env
            _env = pvtest.DockerSetup(lambda dk: [{"node": "dk", "endpoint": dk.endpoint}])
    """

    def __init__(self, agents, config=None, tls=False, registry=False, daemon_cpus=None,
                 alive=()):
        why = docker_missing()
        if why:
            raise unittest.SkipTest(why)
        self.stack = None
        auth = registry if isinstance(registry, tuple) else None
        self.registry = Registry(auth=auth) if registry else None
        self.daemon = DockerDaemon(tls=tls, cpus=daemon_cpus).start()
        try:
            if self.registry:
                self.registry.start()
            self.daemon.import_busybox("demo:1")
            cfg = dict((config(self.daemon) if callable(config) else config) or {})
            if auth:
                cfg["registry.auths"] = ["%s=%s:%s" % (self.registry.addr, auth[0], auth[1])]
            self.stack = Stack(gateways=1, workers=1, schedulers=1, agents=agents(self.daemon),
                               config=cfg)
            self.stack.start()
            self.stack.wait_alive(alive)
        except BaseException:
            self.stop()
            raise

    def stop(self):
        try:
            if self.stack and not self.stack.stopped:
                self.stack.stop()
        finally:
            if self.registry:
                self.registry.stop()
            self.daemon.stop()
