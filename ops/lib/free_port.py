#!/usr/bin/python3
"""Print a TCP port that is free on 127.0.0.1 right now.

The port is drawn below the kernel's ephemeral range (net.ipv4.ip_local_port_range), so that
client sockets opened meanwhile cannot take it before the server binds it. Usage:
free_port.py [COUNT] prints COUNT distinct ports, one per line.
"""
import random
import socket
import sys


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def free_port(taken=()):
    high = max(_ephemeral_low() - 1, 20001)
    for _ in range(200):
        port = random.randint(20000, high)
        if port not in taken and _bindable(port):
            return port
    raise RuntimeError("no free port found on 127.0.0.1 between 20000 and %d" % high)


def main():
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    ports = []
    while len(ports) < count:
        ports.append(free_port(ports))
    print("\n".join(str(p) for p in ports))
    return 0


if __name__ == "__main__":
    sys.exit(main())
