#!/usr/bin/python3 -I
"""tail_file: the last N lines of a file under /var/log.

Args (stdin): {"path": "/var/log/syslog", "lines": 50}
Result: {"path", "lines": [...], "size_bytes", "truncated"}. Reads at most
the last 1 MiB. The sandbox grant (fs_read /var/log) is what keeps it
there; the prefix check below only gives a clear error first.
"""
import json
import os
import sys

MAX_READ = 1 << 20
args = json.load(sys.stdin)
path, want = args["path"], int(args.get("lines", 50))
real = os.path.realpath(path)
if not real.startswith("/var/log/"):
    print(f"tail_file: {path} resolves to {real}, outside /var/log", file=sys.stderr)
    sys.exit(2)
try:
    fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not (st.st_mode & 0o170000) == 0o100000:
            print(f"tail_file: {path}: not a regular file", file=sys.stderr)
            sys.exit(2)
        start = max(0, st.st_size - MAX_READ)
        f.seek(start)
        data = f.read(MAX_READ)
except OSError as e:
    print(f"tail_file: {path}: {e.strerror}", file=sys.stderr)
    sys.exit(1)
lines = data.decode("utf-8", "replace").splitlines()
if start > 0 and lines:
    lines = lines[1:]  # the first line is probably cut
print(json.dumps({"path": path, "lines": lines[-want:], "size_bytes": st.st_size,
                  "truncated": start > 0 or len(lines) > want}))
