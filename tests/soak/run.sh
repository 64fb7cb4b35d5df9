#!/usr/bin/env bash
# The soak, not part of `cargo test`: builds the binaries
# and drives `ongrid-skill up` with 16 clients for 10 minutes (pass
# --duration SECS, --warmup SECS, --clients N, --reload-every SECS, --keep).
# Needs root and sqlite3. Exit 0 = every check passed (see tests/soak/main.rs).
set -euo pipefail
cd "$(dirname "$0")/../.."
profile=${SOAK_PROFILE:-debug}
if [[ $profile == release ]]; then
    cargo build --locked --release --bins -p ongrid-loader -p ongrid-executor -p ongrid-tests
else
    cargo build --locked --bins -p ongrid-loader -p ongrid-executor -p ongrid-tests
fi
exec "target/$profile/soak" "$@"
