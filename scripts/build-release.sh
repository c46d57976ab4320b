#!/usr/bin/env bash
# Release builds of the two Lambda functions with cargo-lambda, and their sizes.
#
#   scripts/build-release.sh            arm64 if its Rust target is (or can be) installed,
#                                       otherwise the host architecture
#   scripts/build-release.sh arm64      Graviton (the template's default Architecture)
#   scripts/build-release.sh x86_64
#   scripts/build-release.sh all        both; outputs go to target/lambda-<arch>/
#
# Output: target/lambda/<function>/bootstrap (one architecture) — the same layout
# `sam build` produces through `BuildMethod: rust-cargolambda` — and a table of the
# stripped binary sizes (the release profile in Cargo.toml strips symbols and uses LTO).
#
# Cross-compiling (and linking against the glibc of provided.al2023) uses zig, which the
# PyPI cargo-lambda brings along (the `ziglang` package). Without zig, a build for the
# host architecture falls back to `--compiler cargo` (plain cargo and the system linker:
# the binary then needs the build machine's glibc symbol versions; provided.al2023 has
# glibc 2.34, so the table below shows the newest GLIBC_x.y each binary requires).
# arm64 also needs the Rust standard library for aarch64-unknown-linux-gnu:
# `rustup target add aarch64-unknown-linux-gnu`, which this script tries once.
#
# Environment: SECKILL_FUNCTIONS (default "seckill-http order-drainer"),
# CARGO_LAMBDA_COMPILER (force a backend: cargo-zigbuild or cargo).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ensure_path
cd "$SECKILL_ROOT"

read -r -a FUNCTIONS <<<"${SECKILL_FUNCTIONS:-seckill-http order-drainer}"

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
}

host_arch() {
    case "$(uname -m)" in
    x86_64 | amd64) echo x86_64 ;;
    aarch64 | arm64) echo arm64 ;;
    *) die "unsupported host architecture $(uname -m)" ;;
    esac
}

rust_target() {
    case "$1" in
    arm64) echo aarch64-unknown-linux-gnu ;;
    x86_64) echo x86_64-unknown-linux-gnu ;;
    esac
}

target_installed() {
    local triple
    triple=$(rust_target "$1")
    [[ $1 == "$(host_arch)" ]] && return 0
    command -v rustup >/dev/null 2>&1 || return 1
    rustup target list --installed 2>/dev/null | grep -qx "$triple"
}

# Installs the Rust standard library for an architecture if rustup can (needs network).
ensure_target() {
    local arch=$1 triple
    triple=$(rust_target "$arch")
    target_installed "$arch" && return 0
    command -v rustup >/dev/null 2>&1 || return 1
    log "installing the Rust target $triple (rustup target add $triple)"
    rustup target add "$triple" </dev/null >&2 || return 1
}

have_zig() {
    command -v zig >/dev/null 2>&1 && return 0
    local py
    for py in python3 python; do
        command -v "$py" >/dev/null 2>&1 && "$py" -m ziglang version >/dev/null 2>&1 && return 0
    done
    return 1
}

size_of() { stat -c %s "$1" 2>/dev/null || stat -f %z "$1"; }

human() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }

# Size of the binary as Lambda receives it: a zip with one deflated entry.
zipped_size() {
    local py
    for py in python3 python; do
        if command -v "$py" >/dev/null 2>&1; then
            "$py" - "$1" <<'EOF' && return 0
import io, sys, zipfile
buf = io.BytesIO()
with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
    z.write(sys.argv[1], "bootstrap")
print(len(buf.getvalue()))
EOF
        fi
    done
    echo "?"
}

# --- arguments -----------------------------------------------------------------------
want=${1:-auto}
case "$want" in
-h | --help)
    usage
    exit 0
    ;;
auto)
    if [[ $(host_arch) == arm64 ]] || ensure_target arm64; then
        arches=(arm64)
    else
        warn "the Rust target aarch64-unknown-linux-gnu is not installed and could not be added;
building for the host ($(host_arch)). Deploy with Architecture=$(host_arch) then."
        arches=("$(host_arch)")
    fi
    ;;
arm64 | aarch64) arches=(arm64) ;;
x86_64 | x86-64 | amd64) arches=(x86_64) ;;
all | both) arches=(arm64 x86_64) ;;
*)
    usage >&2
    die "unknown architecture '$want' (arm64, x86_64, all)"
    ;;
esac

command -v cargo >/dev/null 2>&1 || die "cargo not found (install Rust with rustup)"
cargo lambda --version >/dev/null 2>&1 ||
    die "cargo-lambda not found: pip install cargo-lambda (it brings zig along)"

bins=()
for f in "${FUNCTIONS[@]}"; do bins+=(--bin "$f"); done

declare -a REPORT=()
for arch in "${arches[@]}"; do
    ensure_target "$arch" || die "the Rust target $(rust_target "$arch") is missing and rustup could not add it.
Build for the host instead: $0 $(host_arch)"

    compiler_args=()
    if [[ -n ${CARGO_LAMBDA_COMPILER:-} ]]; then
        compiler_args=(--compiler "$CARGO_LAMBDA_COMPILER")
    elif ! have_zig; then
        if [[ $arch == "$(host_arch)" ]]; then
            warn "zig not found (pip install ziglang, or the PyPI cargo-lambda): building with --compiler cargo"
            compiler_args=(--compiler cargo)
        else
            die "cross-compiling to $arch needs zig: pip install ziglang (the PyPI cargo-lambda brings it)"
        fi
    fi

    lambda_dir=target/lambda
    ((${#arches[@]} > 1)) && lambda_dir="target/lambda-$arch"

    cmd=(cargo lambda build --release "--$([[ $arch == arm64 ]] && echo arm64 || echo x86-64)"
        "${compiler_args[@]}" "${bins[@]}" --lambda-dir "$lambda_dir")
    log "$arch: ${cmd[*]}"
    t0=$(now_s)
    "${cmd[@]}"
    ok "$arch built in $(elapsed_since "$t0")"

    for f in "${FUNCTIONS[@]}"; do
        bin="$lambda_dir/$f/bootstrap"
        [[ -f $bin ]] || die "expected $bin after the build"
        bytes=$(size_of "$bin")
        zipped=$(zipped_size "$bin")
        desc=""
        if command -v file >/dev/null 2>&1; then
            desc=$(file -b "$bin" | grep -o -E 'ARM aarch64|x86-64|not stripped|stripped' | awk '!seen[$0]++' | paste -sd, -)
        fi
        glibc=""
        if command -v objdump >/dev/null 2>&1; then
            glibc=$(objdump -T "$bin" 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n1 || true)
        fi
        REPORT+=("$(printf '%-7s %-14s %10s bytes (%s)  zipped %10s bytes  needs %-11s %s  [%s]' \
            "$arch" "$f" "$bytes" "$(human "$bytes")" "$zipped" "${glibc:-?}" "$bin" "$desc")")
    done
done

printf '\nrelease binaries (stripped, LTO):\n'
printf '  %s\n' "${REPORT[@]}"
