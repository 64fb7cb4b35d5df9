#!/bin/sh
# disk_usage: `df -P -k` as one JSON object. Args (stdin): {"mount_prefix": "/"}.
# Runs with an empty environment (no PATH): every tool by absolute path.
set -eu
args=$(/bin/cat)
# The schema (checked before the run) guarantees a string starting with "/";
# take the value between the quotes, JSON escapes are not expected in paths.
prefix=$(printf '%s' "$args" | /bin/sed -n 's/.*"mount_prefix"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p')
/bin/df -P -k | /usr/bin/awk -v prefix="$prefix" '
    function js(s) { gsub(/\\/, "\\\\", s); gsub(/"/, "\\\"", s); return "\"" s "\"" }
    NR == 1 { next }
    {
        # The mount point is everything from field 6 on (it may hold spaces).
        mount = $6
        for (i = 7; i <= NF; i++) mount = mount " " $i
        if (prefix != "" && index(mount, prefix) != 1) next
        ratio = ($3 + $4) > 0 ? $3 / ($3 + $4) : 0
        printf "%s{\"filesystem\":%s,\"mount\":%s,\"size_bytes\":%.0f,\"used_bytes\":%.0f,\"available_bytes\":%.0f,\"used_ratio\":%.4f}", \
            (n++ ? "," : ""), js($1), js(mount), $2 * 1024, $3 * 1024, $4 * 1024, ratio
    }
    BEGIN { printf "{\"filesystems\":[" }
    END { printf "]}\n" }'
