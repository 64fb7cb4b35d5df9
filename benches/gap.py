#!/usr/bin/env python3
"""Setup cost of served runs after idle gaps (the cgroup attach lock's
RCU grace period after an idle host).

usage: gap.py BIN_DIR GAPS_MS(comma-separated) RUNS_PER_GAP   (as root)

Starts `BIN_DIR/ongrid-executor serve` alone on a temporary config with one
skill (a copy of /bin/cat), warms it with 50 runs, then for each gap sleeps
that long before each run (one connection per run) and prints the reports'
`setup_us` and the wall time, p50 and p90.
"""
import json, os, socket, subprocess, sys, tempfile, time, statistics, shutil
bin_dir = sys.argv[1]
gaps_ms = [float(x) for x in sys.argv[2].split(',')]
n = int(sys.argv[3])
base = tempfile.mkdtemp(prefix='gap', dir='/tmp'); os.chmod(base, 0o755)
root = os.path.join(base, 'skills'); os.makedirs(os.path.join(root, 'cat')); os.chmod(root, 0o755); os.chmod(os.path.join(root,'cat'), 0o755)
shutil.copy('/bin/cat', os.path.join(root, 'cat', 'run')); os.chmod(os.path.join(root,'cat','run'), 0o755)
man = os.path.join(root, 'cat', 'skill.json')
open(man, 'w').write('{"name":"cat","description":"t","entry":"run"}')
sock = os.path.join(base, 'executor.sock')
open(os.path.join(base, 'executor.toml'), 'w').write(
 f'roots = ["{root}"]\nruntime_dir = "{base}/run"\nsocket = "{sock}"\nsocket_owner = "0"\nsocket_group = "0"\nsocket_mode = "0600"\nallowed_uids = [0]\nallowed_gids = []\nlandlock = "best-effort"\n')
ex = subprocess.Popen([os.path.join(bin_dir, 'ongrid-executor'), 'serve', '--config', os.path.join(base, 'executor.toml')], stderr=open(os.path.join(base,'log'),'w'))
for _ in range(100):
    if os.path.exists(sock): break
    time.sleep(0.05)
def run(i):
    s = socket.socket(socket.AF_UNIX); s.connect(sock)
    t0 = time.perf_counter()
    s.sendall((json.dumps({"jsonrpc":"2.0","id":i,"method":"execute","params":{"manifest":man,"args":{"x":1}}})+"\n").encode())
    buf = b''
    while not buf.endswith(b'\n'):
        c = s.recv(65536)
        if not c: break
        buf += c
    wall = (time.perf_counter()-t0)*1e6
    s.close()
    r = json.loads(buf)['result']
    assert r['outcome'] == 'ok', r
    return r['setup_us'], wall
try:
    for i in range(50): run(i)
    for g in gaps_ms:
        setups, walls = [], []
        for i in range(n):
            time.sleep(g/1000)
            su, w = run(i)
            setups.append(su); walls.append(w)
        q = lambda v, p: sorted(v)[int(p*(len(v)-1))]
        print(f"gap {g:6.1f} ms: setup_us p50 {q(setups,.5):6.0f} p90 {q(setups,.9):6.0f} | wall p50 {q(walls,.5):6.0f} p90 {q(walls,.9):6.0f} us  (n={n})", flush=True)
finally:
    ex.terminate(); ex.wait()
    shutil.rmtree(base, ignore_errors=True)
