"""pvnet: several hosts on one machine for the e2e tests (not a test itself): network
namespaces joined by veth pairs on a bridge that lives in a namespace of its own, so every
address exists only inside the namespaces the test made. Needs root and ip(8).

    net = pvnet.Net(["ctl", "n1", "n2", "n3"])   # hosts ctl=10.77.<k>.1, n1=.2, ...
    net.create()
    net.run("n1", "ip", "link", "set", "eth0", "down")   # a partition of n1
    net.kill_all("n2")                                    # a crash of everything on n2
    net.freeze("n3"); net.thaw("n3")                      # a freeze of the whole of n3
    net.destroy()                                         # processes killed, namespaces gone

A test then runs its own body inside the "ctl" host (Net.reexec_inside): the hosts' addresses
are reachable from there, and nowhere else. NetStack is a pvtest.Stack whose Redis listens on
the control host's address too, whose gateway, ops workers and scheduler run on the control
host, and whose node agents each run on a host of their own with their own data directory.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pvtest

IP = shutil.which("ip") or "/usr/sbin/ip"


def available():
    """None when namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not os.access(IP, os.X_OK):
        return "ip(8) is not installed"
    r = subprocess.run([IP, "netns", "list"], capture_output=True)
    return None if r.returncode == 0 else "ip netns does not work here: %s" % r.stderr.decode()


class Net:
    """Hosts named by HOSTS, each a namespace "<tag><name>" with eth0 at 10.77.<subnet>.<i+1>/24
    on bridge br0 of namespace "<tag>br"."""

    def __init__(self, hosts, tag=None, subnet=None):
        self.tag = tag or "pvn%d" % os.getpid()
        self.subnet = subnet if subnet is not None else 100 + os.getpid() % 150
        self.hosts = list(hosts)
        self.bridge_ns = self.tag + "br"

    def ns(self, host):
        return self.tag + host

    def addr(self, host):
        return "10.77.%d.%d" % (self.subnet, self.hosts.index(host) + 1)

    def _ip(self, *args, check=True):
        return subprocess.run([IP] + list(args), capture_output=True, text=True, check=check)

    def create(self):
        self._ip("netns", "add", self.bridge_ns)
        self._ip("-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
        self._ip("-n", self.bridge_ns, "link", "set", "br0", "up")
        for i, h in enumerate(self.hosts):
            ns = self.ns(h)
            self._ip("netns", "add", ns)
            self._ip("-n", ns, "link", "set", "lo", "up")
            # both ends are made inside the host's namespace, then one moves to the bridge's
            self._ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", "p%d" % i)
            self._ip("-n", ns, "link", "set", "p%d" % i, "netns", self.bridge_ns)
            self._ip("-n", self.bridge_ns, "link", "set", "p%d" % i, "master", "br0")
            self._ip("-n", self.bridge_ns, "link", "set", "p%d" % i, "up")
            self._ip("-n", ns, "addr", "add", self.addr(h) + "/24", "dev", "eth0")
            self._ip("-n", ns, "link", "set", "eth0", "up")
        return self

    def run(self, host, *argv, check=True):
        return subprocess.run([IP, "netns", "exec", self.ns(host)] + list(argv),
                              capture_output=True, text=True, check=check)

    def argv(self, host, argv):
        """ARGV run on HOST."""
        return [IP, "netns", "exec", self.ns(host)] + list(argv)

    def pids(self, host):
        r = self._ip("netns", "pids", self.ns(host), check=False)
        return [int(p) for p in r.stdout.split()]

    def signal_all(self, host, sig):
        for pid in self.pids(host):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def kill_all(self, host):
        self.signal_all(host, signal.SIGKILL)

    def freeze(self, host):
        """SIGSTOP of everything on HOST, again until no process there was forked after the
        listing (a shell's child forked between the listing and its parent's stop would run)."""
        stopped = set()
        while True:
            new = [p for p in self.pids(host) if p not in stopped]
            if not new:
                return
            for pid in new:
                try:
                    os.kill(pid, signal.SIGSTOP)
                except ProcessLookupError:
                    pass
            stopped.update(new)

    def thaw(self, host):
        """SIGCONT of everything on HOST, in the order `ip netns pids` lists them."""
        self.signal_all(host, signal.SIGCONT)

    def link(self, host, up):
        self.run(host, IP, "link", "set", "eth0", "up" if up else "down")

    def destroy(self):
        for h in self.hosts:
            self.signal_all(h, signal.SIGCONT)
            self.kill_all(h)
        for h in self.hosts:
            self._ip("netns", "del", self.ns(h), check=False)
        self._ip("netns", "del", self.bridge_ns, check=False)

    # -- running a test inside the control host

    ENV = "PV_NET"

    def describe(self):
        return json.dumps({"tag": self.tag, "subnet": self.subnet, "hosts": self.hosts})

    @classmethod
    def inside(cls):
        """The Net this process was re-executed into (reexec_inside), or None."""
        d = os.environ.get(cls.ENV)
        if not d:
            return None
        d = json.loads(d)
        return cls(d["hosts"], tag=d["tag"], subnet=d["subnet"])

    def reexec_inside(self, host, script, args):
        """Runs SCRIPT ARGS with /usr/bin/python3 on HOST, this Net described in its
        environment; its exit code."""
        env = dict(os.environ, **{self.ENV: self.describe()})
        return subprocess.run(self.argv(host, ["/usr/bin/python3", script] + list(args)),
                              env=env).returncode


class NetStack(pvtest.Stack):
    """A pvtest.Stack for a Net: Redis on 127.0.0.1 and the control host's address, the
    gateway, ops workers and scheduler on the control host (this process's), and one node
    agent per name of AGENT_HOSTS on that host, pod POD, data in <tmpdir>/hosts/<host>."""

    def __init__(self, net, agent_hosts, pod, control="ctl", config=None, workers=2):
        super().__init__(gateways=1, workers=workers, schedulers=1, config=config)
        self.net = net
        ctl_ip = net.addr(control)
        argv = self.redis._argv

        def bound():
            a = argv()
            a[a.index("--bind") + 1] = "127.0.0.1 " + ctl_ip
            return a
        self.redis._argv = bound
        self.host_dirs = {}
        for h in agent_hosts:
            d = os.path.join(self.tmpdir, "hosts", h)
            os.makedirs(os.path.join(d, "images"), exist_ok=True)
            self.host_dirs[h] = d
            p = pvtest.Proc("agent-%s" % h, net.argv(h, [
                os.path.join(pvtest.BIN_DIR, "pivirt-worker"), "--config", self.config_path,
                "--set", "worker.node=" + h, "--set", "worker.pod=" + pod,
                "--set", "data_dir=" + d,
                "--set", "redis.addr=%s:%d" % (ctl_ip, self.redis.port)]), self.tmpdir, self.env)
            p.kind = "agent"
            self.agents.append(p)
            self.agent_nodes.append(h)
            self.agent_pods.append(pod)

    def agent(self, host):
        return self.agents[self.agent_nodes.index(host)]

    def write_image(self, name, tag, script):
        for d in self.host_dirs.values():
            pvtest.write_script_image(d, name, tag, script)

    def engine_record(self, host, wid):
        try:
            with open(os.path.join(self.host_dirs[host], "engine", host, wid,
                                   "record.json")) as f:
                return json.load(f)
        except FileNotFoundError:
            return None

    def fence_log(self, host):
        try:
            with open(os.path.join(self.host_dirs[host], "node", host, "fence.log")) as f:
                return [line.split() for line in f]
        except FileNotFoundError:
            return []


def wait_for(what, fn, timeout=30, step=0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(step)
    raise AssertionError("timed out waiting for " + what)


if __name__ == "__main__":
    sys.exit("pvnet is a helper of the e2e tests, not a test")
