#!/usr/bin/python3 -I
"""probe_dns: one DNS query over UDP to one server, decoded.

Args (stdin): {"name": "example.org", "type": "A", "server": "127.0.0.1",
               "port": 53, "timeout_seconds": 3}
Result: {"name", "type", "server", "port", "rcode", "answers": [{"name",
"type", "ttl", "data"}], "truncated", "latency_ms", "error"}. No answer
in time is a finished probe ("error": "timeout"). Needs the network grant.
"""
import ipaddress
import json
import os
import socket
import struct
import sys
import time

TYPES = {"A": 1, "NS": 2, "CNAME": 5, "SOA": 6, "PTR": 12, "MX": 15, "TXT": 16, "AAAA": 28}
NAMES = {v: k for k, v in TYPES.items()}
RCODES = {0: "NOERROR", 1: "FORMERR", 2: "SERVFAIL", 3: "NXDOMAIN", 4: "NOTIMP", 5: "REFUSED"}


def default_server():
    try:
        with open("/etc/resolv.conf") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[0] == "nameserver":
                    return parts[1]
    except OSError:
        pass
    return "127.0.0.1"


def encode_name(name):
    out = b""
    for label in name.rstrip(".").split("."):
        raw = label.encode("ascii")
        if not 0 < len(raw) < 64:
            raise ValueError(f"bad label in {name!r}")
        out += bytes([len(raw)]) + raw
    return out + b"\0"


def read_name(msg, at):
    """Returns (name, offset after the name); follows at most 32 pointers."""
    labels, end, jumps = [], None, 0
    while True:
        if at >= len(msg):
            raise ValueError("name past the end")
        n = msg[at]
        if n & 0xC0 == 0xC0:
            if jumps > 32 or at + 1 >= len(msg):
                raise ValueError("bad compression pointer")
            if end is None:
                end = at + 2
            at, jumps = ((n & 0x3F) << 8) | msg[at + 1], jumps + 1
        elif n == 0:
            return ".".join(labels) + ".", (end if end is not None else at + 1)
        else:
            labels.append(msg[at + 1:at + 1 + n].decode("ascii", "replace"))
            at += 1 + n


def rdata(msg, kind, at, length):
    raw = msg[at:at + length]
    if kind == 1 and length == 4:
        return socket.inet_ntop(socket.AF_INET, raw)
    if kind == 28 and length == 16:
        return socket.inet_ntop(socket.AF_INET6, raw)
    if kind in (2, 5, 12):
        return read_name(msg, at)[0]
    if kind == 15:
        return f"{struct.unpack('!H', raw[:2])[0]} {read_name(msg, at + 2)[0]}"
    if kind == 16:
        parts, i = [], 0
        while i < len(raw):
            parts.append(raw[i + 1:i + 1 + raw[i]].decode("utf-8", "replace"))
            i += 1 + raw[i]
        return "".join(parts)
    if kind == 6:
        mname, i = read_name(msg, at)
        rname, i = read_name(msg, i)
        serial = struct.unpack("!I", msg[i:i + 4])[0]
        return f"{mname} {rname} {serial}"
    return raw.hex()


args = json.load(sys.stdin)
name, kind = args["name"], args.get("type", "A")
server = args.get("server") or default_server()
port = int(args.get("port", 53))
timeout = float(args.get("timeout_seconds", 3))
ip = ipaddress.ip_address(server)
out = {"name": name, "type": kind, "server": server, "port": port, "rcode": None,
       "answers": [], "truncated": False, "latency_ms": None, "error": None}
qid = int.from_bytes(os.urandom(2), "big")
query = struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0) + encode_name(name) + struct.pack("!HH", TYPES[kind], 1)
family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
with socket.socket(family, socket.SOCK_DGRAM) as s:
    s.settimeout(timeout)
    started = time.monotonic()
    try:
        s.sendto(query, (server, port))
        while True:
            msg, peer = s.recvfrom(65535)
            if len(msg) >= 12 and struct.unpack("!H", msg[:2])[0] == qid:
                break
    except socket.timeout:
        out["error"] = "timeout"
        print(f"probe_dns: no answer from {server}:{port} in {timeout}s", file=sys.stderr)
        print(json.dumps(out))
        sys.exit(0)
    except OSError as e:
        out["error"] = str(e)
        print(f"probe_dns: {server}:{port}: {e}", file=sys.stderr)
        print(json.dumps(out))
        sys.exit(0)
out["latency_ms"] = round((time.monotonic() - started) * 1000, 3)
_, flags, qd, an, _, _ = struct.unpack("!HHHHHH", msg[:12])
out["rcode"] = RCODES.get(flags & 0xF, str(flags & 0xF))
out["truncated"] = bool(flags & 0x0200)
at = 12
for _ in range(qd):
    at = read_name(msg, at)[1] + 4
for _ in range(min(an, 256)):
    rname, at = read_name(msg, at)
    rtype, _, ttl, length = struct.unpack("!HHIH", msg[at:at + 10])
    at += 10
    out["answers"].append({"name": rname, "type": NAMES.get(rtype, str(rtype)), "ttl": ttl,
                           "data": rdata(msg, rtype, at, length)})
    at += length
print(json.dumps(out))
