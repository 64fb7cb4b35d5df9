#!/usr/bin/python3 -I
"""probe_tcp: connect to host:port, report reachability and connect time.

Args (stdin): {"host": "db1", "port": 5432, "timeout_seconds": 3}
Result: {"host", "port", "reachable", "address", "latency_ms", "error"}.
An unreachable port or a failed name lookup is a finished probe
(reachable: false, "error" says why); only bad input fails the run.
Needs the network grant.
"""
import json
import socket
import sys
import time

args = json.load(sys.stdin)
host, port = args["host"], int(args["port"])
timeout = float(args.get("timeout_seconds", 3))
out = {"host": host, "port": port, "reachable": False, "address": None,
       "latency_ms": None, "error": None}
try:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
except socket.gaierror as e:
    print(f"probe_tcp: cannot resolve {host!r}: {e}", file=sys.stderr)
    out["error"] = f"resolve: {e}"
    infos = []
for family, kind, proto, _, addr in infos:
    s = socket.socket(family, kind, proto)
    s.settimeout(timeout)
    started = time.monotonic()
    try:
        s.connect(addr)
        out.update(reachable=True, address=addr[0], error=None,
                   latency_ms=round((time.monotonic() - started) * 1000, 3))
        break
    except OSError as e:
        out.update(address=addr[0], error=str(e) or type(e).__name__)
    finally:
        s.close()
print(json.dumps(out))
