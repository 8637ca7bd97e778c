"""End-to-end test of libvirt networks under real VMs (label vm): two guests on one isolated
network reach each other, tested from inside one of them.

A virt://qemu:///system node (vmtest.py: the test guest, TCG) and an isolated libvirt network
the module defines (transient, no <forward>, a bridge of its own, names unique to the run:
pvnet-<pid>-<hex>, bridge pvbr<hex>) and destroys at the end. The network has no <ip>: the host
has no address on it and libvirt runs no dnsmasq (not installed here), so the guests get static
addresses through their guest agents (busybox `ip addr add`, ExecuteWorkload). Two guests of
128 MiB run at once (the other VM modules keep one).

  test_two_guests_reach_each_other
      ListNetworks lists the network; guest A is deployed on it (the deploy's networks: its
      interface is there at boot), guest B is deployed without and ConnectNetwork hot-plugs it
      (its answer names the network); each guest finds the interface by the MAC libvirt has on
      the network (RawEngine domain_xml), takes 10.77.0.1/24 and 10.77.0.2/24; from inside A,
      ping reaches B, and a line sent with nc to a listener in B arrives there; after
      DisconnectNetwork of B, A's ping gets no answer (the traffic went over that network and
      nothing else: the guests' user-mode interfaces cannot reach each other); both removed,
      no domain left.
  test_fixed_address_released
      a persistent network with DHCP, never started (no dnsmasq here), takes the host entry
      that ConnectNetwork with ipv4 reserves for a stopped guest's new interface (virsh
      net-dumpxml --inactive: its MAC and the address); DisconnectNetwork drops it; connected
      again, RemoveWorkload drops it too.
"""
import os
import secrets
import subprocess
import time
import xml.etree.ElementTree as ET

import pvtest
import vmtest
from vmtest import VIRSH, Base, say
from pb import core_pb2

POD = "vnp"
NODE = "vnq1"
HEX = secrets.token_hex(4)
NETWORK = "pvnet-%d-%s" % (os.getpid(), HEX)
BRIDGE = "pvbr" + HEX  # 12 characters: a Linux interface name has at most 15
DHCP_NETWORK = NETWORK + "-dhcp"  # persistent, never started: test_fixed_address_released
DHCP_BRIDGE = "pvbd" + HEX
ADDR = {"a": "10.77.0.1", "b": "10.77.0.2"}
PORT = 7777


def setUpModule():
    vmtest.start_stack(POD, NODE, "vnt")
    xml = ("<network><name>%s</name><bridge name='%s' stp='off' delay='0'/></network>" %
           (NETWORK, BRIDGE))
    r = subprocess.run(VIRSH + ["net-create", "/dev/stdin"], input=xml, capture_output=True,
                       text=True)
    if r.returncode != 0:
        vmtest.stop_stack()
        raise RuntimeError("libvirt cannot create the isolated network %s (bridge %s) on this "
                           "machine: virsh net-create: %s" % (NETWORK, BRIDGE,
                                                              (r.stderr or r.stdout).strip()))
    say("isolated network %s on bridge %s" % (NETWORK, BRIDGE))


def tearDownModule():
    try:
        vmtest.stop_stack()
    finally:
        subprocess.run(VIRSH + ["net-destroy", NETWORK], capture_output=True)
        subprocess.run(VIRSH + ["net-undefine", DHCP_NETWORK], capture_output=True)


class Network(Base):
    def guest(self, wid, script, timeout=60):
        return self.execute(wid, ["/bin/sh", "-c", script], timeout=timeout)

    def mac_on_network(self, wid):
        dom = ET.fromstring(self.raw(wid, "domain_xml"))
        macs = [i.find("mac").get("address") for i in dom.iter("interface")
                if i.get("type") == "network" and i.find("source") is not None and
                i.find("source").get("network") == NETWORK]
        self.assertEqual(len(macs), 1, "%s: interfaces on %s: %s" % (wid, NETWORK, macs))
        return macs[0]

    def iface_of(self, wid, mac, timeout=30):
        """The guest's interface with MAC mac; a hot-plugged one appears once the guest's
        kernel has probed the new PCI device."""
        script = ("for i in /sys/class/net/*; do [ \"$(cat $i/address)\" = %s ] && "
                  "basename $i; done; true" % mac)
        deadline = time.monotonic() + timeout
        while True:
            out, code = self.guest(wid, script)
            self.assertEqual(code, "[exitcode] 0", out)
            if out.strip():
                return out.strip()
            if time.monotonic() > deadline:
                out, _ = self.guest(wid, "ip -o link; dmesg | tail -5")
                self.fail("%s: no interface with MAC %s in the guest: %s" % (wid, mac, out))
            time.sleep(0.5)

    def address(self, wid, name):
        iface = self.iface_of(wid, self.mac_on_network(wid))
        out, code = self.guest(wid, "ip addr add %s/24 dev %s && ip link set %s up && "
                                    "ip -o -4 addr show dev %s" % (ADDR[name], iface, iface, iface))
        self.assertEqual(code, "[exitcode] 0", out)
        self.assertIn(ADDR[name] + "/24", out)
        return iface

    def ping(self, wid, to, count=3):
        return self.guest(wid, "ping -c %d -W 2 %s" % (count, to), timeout=60)

    def test_two_guests_reach_each_other(self):
        nets = self.core.ListNetworks(core_pb2.ListNetworkOptions(podname=POD), timeout=30)
        self.assertIn(NETWORK, [n.name for n in nets.networks])
        opts_a = vmtest.deploy("vnta", memory="128M")
        opts_a.networks[NETWORK] = ""
        a, _ = self.create("vnta", opts=opts_a)
        b, _ = self.create("vntb", opts=vmtest.deploy("vntb", memory="128M"))
        try:
            self.wait_agent(a.id)
            self.wait_agent(b.id)
            got = self.core.ConnectNetwork(core_pb2.ConnectNetworkOptions(
                network=NETWORK, target=b.id), timeout=60)
            self.assertEqual(got.name, NETWORK)
            self.address(a.id, "a")
            b_iface = self.address(b.id, "b")
            say("guest %s on %s as %s, guest %s hot-plugged as %s (%s)" % (
                a.name, NETWORK, ADDR["a"], b.name, ADDR["b"], b_iface))
            out, code = self.ping(a.id, ADDR["b"])
            self.assertEqual(code, "[exitcode] 0", "ping from A to B over %s: %s" % (NETWORK, out))
            # busybox ping exits 0 once a reply came; the first may wait for ARP on a loaded host
            self.assertRegex(out, r"3 packets transmitted, [1-3] packets received")
            # a TCP line from A to a listener in B (busybox nc); the listener runs detached
            # (guest-exec answers once its command exits)
            out, code = self.guest(b.id, "nc -l -p %d > /tmp/got </dev/null 2>/tmp/nc.err & "
                                         "echo started" % PORT)
            self.assertEqual((out, code), ("started\n", "[exitcode] 0"))
            deadline = time.monotonic() + 30
            while True:
                out, code = self.guest(a.id, "echo PIVIRT-NET-HELLO | nc -w 3 %s %d" %
                                       (ADDR["b"], PORT))
                if code == "[exitcode] 0" or time.monotonic() > deadline:
                    break
                time.sleep(0.5)  # the listener not up yet: connection refused
            self.assertEqual(code, "[exitcode] 0", out)
            deadline = time.monotonic() + 15
            while True:
                got_b, _ = self.guest(b.id, "cat /tmp/got; cat /tmp/nc.err")
                if "PIVIRT-NET-HELLO" in got_b or time.monotonic() > deadline:
                    break
                time.sleep(0.3)
            self.assertIn("PIVIRT-NET-HELLO", got_b)
            # B off the network: A's ping gets no answer
            self.core.DisconnectNetwork(core_pb2.DisconnectNetworkOptions(
                network=NETWORK, target=b.id), timeout=60)
            # the unplug completes when the guest has let the device go (libvirt waits 5 s
            # for it, then leaves it to QEMU's event)
            deadline = time.monotonic() + 30
            while ("network='%s'" % NETWORK in self.raw(b.id, "domain_xml").replace('"', "'")
                   and time.monotonic() < deadline):
                time.sleep(0.3)
            self.assertNotIn("network='%s'" % NETWORK,
                             self.raw(b.id, "domain_xml").replace('"', "'"))
            out, code = self.guest(b.id, "ls /sys/class/net")
            self.assertNotIn(b_iface, out.split())
            out, code = self.ping(a.id, ADDR["b"], count=2)
            self.assertEqual(code, "[exitcode] 1", out)
            self.assertIn("0 packets received", out)
        finally:
            self.remove(a.id)
            self.remove(b.id)
        self.assertEqual(vmtest.domains("vnt"), [])

    def dhcp_hosts(self):
        """{mac: ip} of the DHCP host entries in DHCP_NETWORK's definition."""
        r = subprocess.run(VIRSH + ["net-dumpxml", "--inactive", DHCP_NETWORK],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        return {h.get("mac"): h.get("ip") for h in ET.fromstring(r.stdout).iter("host")}

    def connect_fixed(self, wid, ipv4):
        got = self.core.ConnectNetwork(core_pb2.ConnectNetworkOptions(
            network=DHCP_NETWORK, target=wid, ipv4=ipv4), timeout=60)
        self.assertEqual(got.name, DHCP_NETWORK)
        dom = ET.fromstring(self.raw(wid, "domain_xml"))
        macs = [i.find("mac").get("address") for i in dom.iter("interface")
                if i.find("source") is not None and
                i.find("source").get("network") == DHCP_NETWORK]
        self.assertEqual(len(macs), 1, macs)
        self.assertEqual(self.dhcp_hosts(), {macs[0]: ipv4})
        return macs[0]

    def test_fixed_address_released(self):
        # a network with DHCP cannot start here (no dnsmasq), but its definition takes host
        # entries: ConnectNetwork's ipv4 reserves one for the stopped VM's new interface
        # (persistent), DisconnectNetwork and RemoveWorkload release it
        xml = ("<network><name>%s</name><bridge name='%s'/><ip address='10.78.0.1' "
               "netmask='255.255.255.0'><dhcp><range start='10.78.0.10' end='10.78.0.99'/>"
               "</dhcp></ip></network>" % (DHCP_NETWORK, DHCP_BRIDGE))
        r = subprocess.run(VIRSH + ["net-define", "/dev/stdin"], input=xml, capture_output=True,
                           text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        c, _ = self.create("vntc", opts=vmtest.deploy("vntc", memory="128M"))
        try:
            self.control(c.id, "stop")
            self.connect_fixed(c.id, "10.78.0.50")
            self.core.DisconnectNetwork(core_pb2.DisconnectNetworkOptions(
                network=DHCP_NETWORK, target=c.id), timeout=60)
            self.assertEqual(self.dhcp_hosts(), {})
            self.connect_fixed(c.id, "10.78.0.51")
        finally:
            self.remove(c.id)
            self.assertEqual(self.dhcp_hosts(), {})
            subprocess.run(VIRSH + ["net-undefine", DHCP_NETWORK], capture_output=True)
        self.assertEqual(vmtest.domains("vntc"), [])

    def test_deploy_on_missing_network(self):
        opts = vmtest.deploy("vntmissing", memory="128M")
        opts.networks[NETWORK + "-none"] = ""
        msgs = list(self.core.CreateWorkload(opts, timeout=120))
        self.assertEqual(len(msgs), 1, msgs)
        self.assertFalse(msgs[0].success)
        self.assertIn('networks: no libvirt network "%s-none"' % NETWORK, msgs[0].error)
        self.assertEqual(vmtest.domains("vntmissing"), [])


if __name__ == "__main__":
    pvtest.main()
