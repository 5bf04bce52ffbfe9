"""A loopback port nothing listens on now, for tests that tell peers where to meet.

Chosen below the kernel's ephemeral range (32768 and up by default), so that an outgoing
connection of another test running beside this one cannot take it before it is listened on;
a port the kernel hands out for bind(0) is in that range and can.
"""
import random
import socket


def free_port(low: int = 20000, high: int = 32000) -> int:
    for _ in range(500):
        port = random.randint(low, high)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port in {low}..{high}")


if __name__ == "__main__":
    print(free_port())
