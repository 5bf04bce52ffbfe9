#!/usr/bin/env python3
"""Reads or writes one key of taiji's embedded rendezvous store, for the launcher tests.

usage: store_tool.py HOST:PORT get KEY     prints the value (exit 3 when absent)
       store_tool.py HOST:PORT set KEY VALUE

Speaks the wire format of src/bootstrap/store_wire.h; a read is a watch whose "known"
value no key holds, which answers at once. Every call gives up after 5 s.
"""
import socket
import struct
import sys


def call(address: str, request: bytes) -> bytes:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host.strip("[]"), int(port)), timeout=5) as s:
        s.sendall(request)
        reply = b""
        while len(reply) < 5 or len(reply) < 5 + struct.unpack("<I", reply[1:5])[0]:
            chunk = s.recv(65536)
            if not chunk:
                raise SystemExit("store_tool: the store closed the connection")
            reply += chunk
    if reply[0] != 0:
        raise SystemExit(f"store_tool: store status {reply[0]}: {reply[5:].decode(errors='replace')}")
    return reply[5:]


def main() -> int:
    if len(sys.argv) < 4 or sys.argv[2] not in ("get", "set"):
        raise SystemExit(__doc__)
    address, op, key = sys.argv[1], sys.argv[2], sys.argv[3].encode()
    head = struct.pack("<I", len(key)) + key
    if op == "set":
        value = sys.argv[4].encode()
        call(address, b"S" + head + struct.pack("<I", len(value)) + value)
        return 0
    reply = call(address, b"W" + head + struct.pack("<IBI", 1000, 0, 1) + b"\0")
    if reply[0] == 0:
        return 3
    print(reply[1:].decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
