#!/usr/bin/env bash
# Builds the ongrid-skills .deb and .rpm from a clean checkout.
#
#   packaging/build.sh            -> target/debian/ongrid-skills_<ver>-1_<arch>.deb
#                                    target/generate-rpm/ongrid-skills-<ver>-1.<arch>.rpm
#
# `target` is cargo's target directory: ./target, or CARGO_TARGET_DIR (or
# build.target-dir) when set; cargo-deb and cargo-generate-rpm map the
# `target/release/...` asset paths of packaging/Cargo.toml to it as well.
#
# Installs the packaging tools when missing: cargo-deb and cargo-generate-rpm
# pinned with --locked (about 4 min of compiling the first time). Man pages
# and shell completions come from the clap definitions (ongrid-gen-docs, a
# bin of the packaging crate), so no help2man.
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO_DEB_VERSION=3.8.0
CARGO_GENERATE_RPM_VERSION=0.21.1
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
target=$(cargo metadata --no-deps --format-version 1 --locked |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
[ -n "$target" ] || { echo "build.sh: cannot find cargo's target directory" >&2; exit 1; }

have_tool() { # crate version: is exactly this version installed?
    cargo install --list 2>/dev/null | grep -qx "$1 v$2:"
}
tools=()
have_tool cargo-deb "$CARGO_DEB_VERSION" || tools+=("cargo-deb@$CARGO_DEB_VERSION")
have_tool cargo-generate-rpm "$CARGO_GENERATE_RPM_VERSION" ||
    tools+=("cargo-generate-rpm@$CARGO_GENERATE_RPM_VERSION")
if ((${#tools[@]})); then
    echo "== cargo install --locked ${tools[*]}"
    cargo install --locked "${tools[@]}"
fi
echo "== cargo build --release (ongrid-loader, ongrid-executor, ongrid-gen-docs)"
if [ "${ONGRID_PACKAGE_QUICK:-0}" = 1 ]; then
    # CI only (.ci/package): the same code without LTO and debug info builds
    # in about half the time; release packages use the profile as written.
    echo "ONGRID_PACKAGE_QUICK=1: release profile without LTO and debug info"
    export CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_DEBUG=0 \
        CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16
fi
# Only the packaged crates: the tests and benches members are not shipped.
cargo build --release --locked -p ongrid-loader -p ongrid-executor -p ongrid-skills

# Packaged copies: stripped (the release profile keeps line tables for
# backtraces in development builds), plus the man pages and completions.
pkg=$target/release/package
rm -rf "$pkg"
mkdir -p "$pkg"
echo "== strip into $pkg"
for bin in ongrid-executor ongrid-skilld ongrid-skill; do
    strip --strip-unneeded --remove-section=.comment --remove-section=.note \
        -o "$pkg/$bin" "$target/release/$bin"
done
echo "== man pages and completions (ongrid-gen-docs)"
"$target/release/ongrid-gen-docs" "$pkg"
gzip -9n "$pkg"/man/*.1 "$pkg"/man/*.8
ls "$pkg"/man "$pkg"/completions/*

echo "== cargo deb"
rm -f "$target"/debian/ongrid-skills_*.deb "$target"/generate-rpm/ongrid-skills-*.rpm
cargo deb -p ongrid-skills --no-build
echo "== cargo generate-rpm"
cargo generate-rpm -p packaging

ls -l "$target"/debian/ongrid-skills_*.deb "$target"/generate-rpm/ongrid-skills-*.rpm
