#!/usr/bin/env python3
"""How long a started process takes from its args to its exit, by how long
it waited for them: the floor under a warm run, with no box and no daemon.

usage: waited.py [WAITS_MS (comma-separated, default 0,1,2,4,8,16,200)] [RUNS]

RUNS rounds, each over every wait in turn: spawns the py-json skill (`/usr/bin/python3`
importing `json`, reading its args from stdin and echoing them), waits
until it sleeps in `read(0, ...)` (`/proc/PID/syscall`), sleeps WAIT ms,
then times the args' write to the output's end of file and to the reaping.
Prints the p50s per wait. Run it pinned (`taskset -c 1`) or with other load
to see whether the host or the process's own state makes the difference.
"""
import os, statistics, sys, tempfile, time

SCRIPT = (
    "#!/usr/bin/python3\nimport json, sys\nargs = json.load(sys.stdin)\n"
    "sys.stdout.write(json.dumps(args, separators=(',', ':')))\n"
)
ARGS = b'{"a":1}'


def spawn(entry):
    r0, w0 = os.pipe()
    r1, w1 = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.dup2(r0, 0)
        os.dup2(w1, 1)
        os.closerange(3, 1024)
        os.execve(entry, [entry], {})
    os.close(r0)
    os.close(w1)
    return pid, w0, r1


def wait_reading(pid):
    deadline = time.monotonic() + 10
    while not open(f'/proc/{pid}/syscall').read().startswith('0 0x0 '):
        if time.monotonic() > deadline:
            sys.exit(f'process {pid} never read its stdin')
        time.sleep(0.0002)


def take(pid, w, r):
    t0 = time.perf_counter()
    os.write(w, ARGS)
    os.close(w)
    out = b''
    while chunk := os.read(r, 4096):
        out += chunk
    t1 = time.perf_counter()
    _, status = os.waitpid(pid, 0)
    t2 = time.perf_counter()
    os.close(r)
    if out != ARGS or status != 0:
        sys.exit(f'the skill answered {out!r} with status {status}')
    return (t1 - t0) * 1e6, (t2 - t0) * 1e6


def main():
    waits = [float(x) for x in (sys.argv[1] if len(sys.argv) > 1 else '0,1,2,4,8,16,200').split(',')]
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    with tempfile.TemporaryDirectory(prefix='waited') as d:
        entry = os.path.join(d, 'run')
        with open(entry, 'w') as f:
            f.write(SCRIPT)
        os.chmod(entry, 0o755)
        got = {wait: [] for wait in waits}
        # Round-robin over the waits, so each sees the same hours of the host.
        for _ in range(runs):
            for wait in waits:
                pid, w, r = spawn(entry)
                wait_reading(pid)
                time.sleep(wait / 1000)
                got[wait].append(take(pid, w, r))
                time.sleep(0.005)
        print(f'{"wait ms":>8} {"args->EOF p50 us":>17} {"args->reaped p50 us":>20}')
        for wait in waits:
            eof = statistics.median(g[0] for g in got[wait])
            reaped = statistics.median(g[1] for g in got[wait])
            print(f'{wait:8g} {eof:17.0f} {reaped:20.0f}')

if __name__ == '__main__':
    main()
