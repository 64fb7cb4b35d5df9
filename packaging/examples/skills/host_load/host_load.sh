#!/bin/sh
# host_load: prints the load averages of /proc/loadavg as one JSON object.
# Runs with an empty environment (no PATH): only shell builtins are used.
set -eu
read -r load1 load5 load15 tasks _last < /proc/loadavg
running=${tasks%/*}
total=${tasks#*/}
printf '{"load1":%s,"load5":%s,"load15":%s,"running_tasks":%s,"total_tasks":%s}\n' \
    "$load1" "$load5" "$load15" "$running" "$total"
