#!/usr/bin/python3 -I
"""probe_http: one GET/HEAD, report status, headers, time, body excerpt.

Args (stdin): {"url": "http://127.0.0.1:8080/health", "method": "GET",
               "timeout_seconds": 5, "body_bytes": 1024}
Result: {"url", "status", "reason", "latency_ms", "headers", "body",
         "body_truncated", "error"}. Any HTTP status is a successful probe;
a connection, DNS or TLS failure is a finished probe too: "status": null
and the "error" (also logged on stderr).
Needs the network grant; HTTPS verifies certificates (/etc/ssl).
"""
import http.client
import json
import ssl
import sys
import time
import urllib.parse

KEEP = ("content-type", "content-length", "server", "location", "cache-control")

args = json.load(sys.stdin)
url = args["url"]
method = args.get("method", "GET")
timeout = float(args.get("timeout_seconds", 5))
body_bytes = int(args.get("body_bytes", 1024))
out = {"url": url, "status": None, "reason": None, "latency_ms": None,
       "headers": {}, "body": None, "body_truncated": False, "error": None}
u = urllib.parse.urlsplit(url)
path = (u.path or "/") + (("?" + u.query) if u.query else "")
started = time.monotonic()
try:
    if u.scheme == "https":
        conn = http.client.HTTPSConnection(u.hostname, u.port, timeout=timeout,
                                           context=ssl.create_default_context())
    else:
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    conn.request(method, path, headers={"User-Agent": "ongrid-probe_http/1"})
    resp = conn.getresponse()
    out["latency_ms"] = round((time.monotonic() - started) * 1000, 3)
    out["status"], out["reason"] = resp.status, resp.reason
    out["headers"] = {k.lower(): v for k, v in resp.getheaders() if k.lower() in KEEP}
    if method == "GET" and body_bytes > 0:
        data = resp.read(body_bytes + 1)
        out["body_truncated"] = len(data) > body_bytes
        out["body"] = data[:body_bytes].decode("utf-8", "replace")
    conn.close()
except (OSError, http.client.HTTPException, ValueError) as e:
    out["error"] = f"{type(e).__name__}: {e}"
    print(f"probe_http: {method} {url}: {out['error']}", file=sys.stderr)
print(json.dumps(out))
