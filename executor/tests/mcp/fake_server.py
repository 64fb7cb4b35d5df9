#!/usr/bin/python3
# A small MCP server over stdio for the executor's tests: well-behaved for
# echo and secret_is, hostile on demand (garbage, flood, stall, die, fork);
# grow and shrink add and remove the tool extra, saying its list changed
# (shrink_later says so after its answer, between calls; grow_soon and
# shrink_soon half a second after their answer, with nobody calling;
# garbage_soon writes a line that is not JSON then);
# progress reports progress (and writes a line on stderr).
import json, os, socket, sys, threading, time, hashlib

TOOLS = ["echo", "secret_is", "garbage", "flood", "stall", "die", "fork", "pid", "connect", "grow", "shrink", "scalar", "progress", "shrink_later", "grow_soon", "shrink_soon", "garbage_soon"]
# One writer at a time: a timer thread writes too.
OUT = threading.Lock()
# The progressToken of the call in flight, when the client asked for progress.
TOKEN = [None]


def send(msg):
    with OUT:
        sys.stdout.write(json.dumps(msg) + "\n")
        sys.stdout.flush()


def change_soon(grow):
    # The tool extra added or removed a moment after the answer, and said
    # so, while no request is in flight.
    def later():
        if grow:
            TOOLS.append("extra")
        else:
            while "extra" in TOOLS:
                TOOLS.remove("extra")
        send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
    threading.Timer(0.5, later).start()


def text(s, is_error=False):
    return {"content": [{"type": "text", "text": s}], "isError": is_error}


def call(name, args):
    if name == "echo":
        return text(json.dumps(args))
    if name == "secret_is":
        # Answers whether the variable equals the digest given, never the value.
        v = os.environ.get(args.get("name", ""), "")
        return text(str(hashlib.sha256(v.encode()).hexdigest() == args.get("sha256")))
    if name == "garbage":
        sys.stdout.write("this is not json\n")
        sys.stdout.flush()
        time.sleep(60)
    if name == "flood":
        chunk = "x" * 65536
        while True:
            sys.stdout.write(chunk)
    if name == "stall":
        time.sleep(3600)
    if name == "die":
        os._exit(7)
    if name == "fork":
        for _ in range(3):
            if os.fork() == 0:
                os.setsid()
                time.sleep(3600)
                os._exit(0)
        time.sleep(3600)
    if name == "connect":
        try:
            with socket.create_connection((args["host"], args["port"]), timeout=2):
                return text("connected")
        except OSError as e:
            return text("refused: %s" % e.strerror, True)
    if name == "grow":
        # A new tool, announced before the answer.
        TOOLS.append("extra")
        send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        return text("grown")
    if name == "shrink":
        # A tool gone, announced before the answer.
        while "extra" in TOOLS:
            TOOLS.remove("extra")
        send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        return text("shrunk")
    if name == "progress":
        # Progress for the call, and a line on stderr, which is not relayed.
        sys.stderr.write("stderr-of-the-server %s\n" % os.environ.get("FAKE_TOKEN", ""))
        sys.stderr.flush()
        for i in (1, 2, 3):
            if TOKEN[0] is not None:
                send({"jsonrpc": "2.0", "method": "notifications/progress", "params": {
                    "progressToken": TOKEN[0], "progress": i, "total": 3, "message": "step %d" % i}})
        # Another request's progress is not this call's.
        send({"jsonrpc": "2.0", "method": "notifications/progress", "params": {
            "progressToken": "other", "progress": 9}})
        return text("done", True)
    if name == "extra":
        return text("extra")
    if name == "pid":
        return text(str(os.getpid()))
    return text("unknown", True)


for line in sys.stdin:
    msg = json.loads(line)
    mid, method = msg.get("id"), msg.get("method")
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": mid, "result": {
            "protocolVersion": msg["params"]["protocolVersion"],
            "capabilities": {"tools": {"listChanged": True}},
            "serverInfo": {"name": "fake", "version": "1"}}})
    elif method == "tools/list":
        tools = [{"name": t, "description": t, "inputSchema": {"type": "object"}} for t in TOOLS]
        send({"jsonrpc": "2.0", "id": mid, "result": {"tools": tools}})
    elif method == "tools/call":
        p = msg["params"]
        TOKEN[0] = (p.get("_meta") or {}).get("progressToken")
        send({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "x"}})
        if p["name"] == "scalar":
            send({"jsonrpc": "2.0", "id": mid, "result": 5})
            continue
        if p["name"] == "garbage_soon":
            send({"jsonrpc": "2.0", "id": mid, "result": text("soon")})
            threading.Timer(0.5, lambda: send("not a message")).start()
            continue
        if p["name"] in ("grow_soon", "shrink_soon"):
            send({"jsonrpc": "2.0", "id": mid, "result": text("soon")})
            change_soon(p["name"] == "grow_soon")
            continue
        if p["name"] == "shrink_later":
            # The tool extra gone after the answer: announced between calls.
            send({"jsonrpc": "2.0", "id": mid, "result": text("later")})
            while "extra" in TOOLS:
                TOOLS.remove("extra")
            send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
            continue
        send({"jsonrpc": "2.0", "id": mid, "result": call(p["name"], p.get("arguments") or {})})
    elif mid is not None:
        send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": "no"}})
