#!/usr/bin/env bash
# The benchmark command: every scenario of seckill-load against the local stack in one
# run (ours and the baselines on the same machine, Redis and callers), then the table of
# ratios.
#
#   scripts/bench.sh                 the issue's sizes (sale S=1,000 A=1,000,000 U=200,000 C=64)
#   scripts/bench.sh --quick         smoke sizes (about 15 s of load once built)
#   scripts/bench.sh --snapshot      also write docs/benchmarks.md and docs/benchmarks-sale.svg
#   scripts/bench.sh -- ARGS...      extra arguments for `seckill-load bench` (see its --help)
#
# It brings the stack up if needed (scripts/stack.sh up), builds seckill-load and both
# functions in release (the workspace profile: LTO, one codegen unit, stripped), and keeps
# every result under bench-results/ (git-ignored): <stamp>.json (everything measured),
# <stamp>-sale.svg (the sale's timeline), <stamp>.txt (the table). Each run uses a fresh
# database and keys of its own and removes them at the end.
#
# Numbers taken while other programs use the CPUs are noisy: the ratios (measured in the
# same run) hold up better than the absolute rates. The tool records the load average and
# the compilers running at the start and the end.
#
# Exit status: 0 all measured, every invariant held; 2 an invariant was violated; 3 every
# invariant held but a baseline FAILED on this Redis (the tutorial's script on a cluster
# of several shards: its rows read FAILED with the server's error; results are kept);
# 1 anything else.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ensure_path
cd "$SECKILL_ROOT"

quick=()
snapshot=0
extra=()
while (($#)); do
    case $1 in
    --quick) quick=(--quick) ;;
    --snapshot) snapshot=1 ;;
    --)
        shift
        extra=("$@")
        break
        ;;
    -h | --help)
        sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *) die "unknown argument $1 (see scripts/bench.sh --help)" ;;
    esac
    shift
done

log "local stack"
scripts/stack.sh up

log "release build of seckill-load, seckill-http and order-drainer"
cargo build --release -p seckill-load -p seckill-http -p order-drainer

stamp=$(date -u +%Y%m%dT%H%M%SZ)
out=bench-results/$stamp
mkdir -p bench-results
builders=$(pgrep -c -x rustc || true)
log "machine: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg), ${builders:-0} rustc running"
((${builders:-0} == 0)) || warn "other builds are running: absolute numbers will be noisy (ratios hold up better)"

set +e
target/release/seckill-load "${quick[@]}" --json "$out.json" --svg "$out-sale.svg" bench \
    --http-bin target/release/seckill-http --drainer-bin target/release/order-drainer \
    "${extra[@]}" | tee "$out.txt"
rc=${PIPESTATUS[0]}
set -e

if ((rc == 1)); then
    die "seckill-load failed (see above); partial results, if any, are not kept"
fi
ok "results: $out.json, $out-sale.svg, $out.txt"
((rc != 3)) || warn "a baseline FAILED on this Redis (see the FAILED rows); exit status 3"

if ((snapshot)); then
    ((rc != 2)) || die "not writing a snapshot of a run whose invariants were violated"
    target/release/seckill-load report --input "$out.json" \
        --markdown docs/benchmarks.md --svg-link benchmarks-sale.svg >/dev/null
    cp "$out-sale.svg" docs/benchmarks-sale.svg
    ok "snapshot written: docs/benchmarks.md, docs/benchmarks-sale.svg (commit them)"
fi
exit "$rc"
