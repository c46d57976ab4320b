#!/usr/bin/env bash
# THE test command: installs what is missing, builds, starts the local stack, runs the
# whole test suite against it, then the Redis-facing suites again on a Valkey cluster,
# then checks formatting and lints.
#
#   scripts/test.sh                      everything
#   scripts/test.sh -p seckill-tests     extra arguments go to `cargo test`
#   scripts/test.sh -- --nocapture       (after `--`: to the test binaries)
#
# Two passes, one stack at a time on the same ports (docs/local-stack.md, "Redis topologies and
# engines"):
#   single   the default stack (SECKILL_REDIS_ENGINE, default redis; one node owning all
#            slots): `cargo test --workspace` but the suites in SUITES_ALONE, then those
#            on their own; or the extra arguments
#   cluster  the stack brought down and up again with SECKILL_REDIS_ENGINE=valkey
#            SECKILL_REDIS_TOPOLOGY=cluster (Valkey 9.1, 3 primaries with one replica
#            each): the suites in CLUSTER_SUITES below, then SUITES_ALONE on their own;
#            with extra arguments before `--`, those arguments instead
# SECKILL_TEST_TOPOLOGIES=single|cluster|both (default both) runs one pass or both.
#
# The stack is stopped at exit unless SECKILL_KEEP_STACK=1 (then the last pass's stack
# keeps running). Exits non-zero if any phase failed; fmt and clippy still run after
# failing tests so one run reports everything.
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ensure_path
cd "$SECKILL_ROOT"

# The suites run a second time on the Valkey cluster: admission, drainer, end to end, the
# waiting room.
CLUSTER_SUITES="admission_lua http_handlers drainer_flow drainer_crash drainer_e2e e2e_http repair stack_smoke redis_fixture payment buckets waiting_room room_line order_events small_sales"
# Run after the others in each pass, each on its own (run_alone): cluster_topology's
# tests start clusters of their own (up to 9 more Valkey processes beside the stack's),
# whose load on 2 cores pushed other suites' requests past their Redis timeout (a 503
# where the test wanted a 409), and whose own slot-moving sale got 503s when other suites
# loaded the machine; the storm puts the stack's database out and fails its Redis over;
# stack_rerun runs `scripts/stack.sh up` again, which rewrites .dev/stack.env and checks
# every service under whatever else runs; fairness drives bots at their limit, a flood
# and the stack's drainer every second for a minute, whose load made a timing claim of
# drainer_flow's (hot sales drained in a loaded run's first seconds) fail beside it.
# That claim's own test runs alone too: its runs have 10 s each to survey 10,000 sales,
# and beside the cluster pass's suites and clippy a fifth run was once needed. Each entry
# is a test-name filter (a suite is `name::`).
SUITES_ALONE="cluster_topology:: storm:: stack_rerun:: fairness:: drainer_flow::ten_thousand_open_sales_drain_within_a_few_runs_hot_ones_first"

TOPOLOGIES=${SECKILL_TEST_TOPOLOGIES:-both}
case $TOPOLOGIES in
single | cluster | both) ;;
*) die "SECKILL_TEST_TOPOLOGIES=$TOPOLOGIES: expected single, cluster or both (the default)" ;;
esac
run_single=0 run_cluster=0
[[ $TOPOLOGIES != cluster ]] && run_single=1
[[ $TOPOLOGIES != single ]] && run_cluster=1
# The single pass keeps the caller's engine (default redis); the cluster pass is Valkey.
SINGLE_ENGINE=${SECKILL_REDIS_ENGINE:-redis}

T_START=$(now_s)
PHASES=()
FAILED=()

# phase NAME COMMAND...: run one phase, time it, remember the outcome.
phase() {
    local name=$1 t0 rc
    shift
    printf '\n%s==== %s%s\n' "$_c_bold" "$name" "$_c_off" >&2
    printf '     $ %s\n' "$*" >&2
    t0=$(now_s)
    set +e
    "$@"
    rc=$?
    set -e
    if ((rc == 0)); then
        PHASES+=("$(printf '%-8s %-28s %s' ok "$name" "$(elapsed_since "$t0")")")
        ok "$name ($(elapsed_since "$t0"))"
    else
        PHASES+=("$(printf '%-8s %-28s %s' FAILED "$name" "$(elapsed_since "$t0")")")
        FAILED+=("$name")
        err "$name FAILED (exit $rc, after $(elapsed_since "$t0"))"
    fi
    return "$rc"
}

# summary RC: the phases, and the verdict. A run that stops early (a signal, an error
# outside a phase) never reads as passed, even when every phase that ran did.
summary() {
    local rc=$1 p
    printf '\n%s==== summary%s\n' "$_c_bold" "$_c_off" >&2
    for p in "${PHASES[@]}"; do printf '  %s\n' "$p" >&2; done
    printf '  total %s\n' "$(elapsed_since "$T_START")" >&2
    if ((${#FAILED[@]})); then
        why_it_failed >&2
        printf '\n%s%sFAILED: %s%s\n' "$_c_red" "$_c_bold" "${FAILED[*]}" "$_c_off" >&2
    elif ((rc != 0)); then
        printf '\n%s%sFAILED: stopped before the end (exit %s)%s\n' "$_c_red" "$_c_bold" "$rc" "$_c_off" >&2
    else
        printf '\n%s%sALL PASSED%s\n' "$_c_grn" "$_c_bold" "$_c_off" >&2
    fi
}

# why_it_failed: what a failure's own output says first, and what the machine had left.
# A build killed for memory or stopped by a full disk says little at the end of its log.
why_it_failed() {
    local f
    if [[ -f ${BUILD_LOG:-} ]] && printf '%s\n' "${FAILED[@]}" | grep -q '^build'; then
        printf '\n  the build said first:\n' >&2
        grep -m 8 -E '^error|No space left|SIGKILL|signal: 9|Killed|memory allocation' "$BUILD_LOG" |
            cut -c1-200 | sed 's/^/    /'
    fi
    f=$(df -h --output=avail "$SECKILL_ROOT" 2>/dev/null | tail -n 1 | tr -d ' ')
    printf '  disk left: %s; memory available: %s MiB\n' "${f:-?}" \
        "$(awk '/MemAvailable/ { print int($2 / 1024) }' /proc/meminfo 2>/dev/null)"
}

stack_started=0
on_exit() {
    local rc=$?
    # A clippy still running beside the tests stops with the run.
    [[ -n ${clippy_pid:-} ]] && kill "$clippy_pid" 2>/dev/null || true
    if ((stack_started)); then
        if [[ ${SECKILL_KEEP_STACK:-0} == 1 ]]; then
            log "SECKILL_KEEP_STACK=1: leaving the stack running (scripts/stack.sh down stops it)"
        else
            "$SECKILL_ROOT/scripts/stack.sh" down || err "stopping the stack failed"
        fi
    fi
    if ((rc == 0 && ${#FAILED[@]})); then rc=1; fi
    summary "$rc"
    exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT TERM

# Tests at a time, whatever the CPU count (a RUST_TEST_THREADS of the caller's wins):
# they mostly wait (on 2 cores the machine sat 89 % idle two at a time; docs/testing.md).
# Both passes run six at a time (the single pass 691 s at two, 341 at four, 243 at six;
# the cluster pass 519, 266, 189), every test passing at each; at eight the cluster pass
# passed too (149 s). A test that races the stack's drainer holds it back itself
# (StackEnv::hold_drainer_back). The suites run alone keep two (run_alone). One stack
# serves them all (one MariaDB, one `cargo lambda watch` serving one request at a time).
SINGLE_TEST_THREADS=${RUST_TEST_THREADS:-6}
CLUSTER_TEST_THREADS=${RUST_TEST_THREADS:-6}
ALONE_TEST_THREADS=${RUST_TEST_THREADS:-2}

# `cargo test --workspace` unless the caller picked packages.
test_args=(--workspace)
selection=0 # arguments before `--`: the caller picked what to test (both passes)
for a in "$@"; do
    [[ $a == -- ]] && break
    selection=1
    case $a in -p | --package | -p* | --package=*) test_args=() ;; esac
done
# The cluster pass selects its suites by name within the one integration binary
# (tests/tests/it: a test's name starts with its suite); the caller's arguments after
# `--` follow the filters.
single_args=("${test_args[@]}" "$@")
cluster_args=("$@")
alone_args=()
if ((!selection)); then
    extra=()
    [[ ${1:-} == -- ]] && extra=("${@:2}")
    single_args=("${test_args[@]}" --)
    cluster_args=(-p seckill-tests --test it --)
    alone_args=(-p seckill-tests --test it --)
    for t in $SUITES_ALONE; do
        single_args+=(--skip "$t")
        cluster_args+=(--skip "$t")
    done
    for t in $CLUSTER_SUITES; do cluster_args+=("$t::"); done
    single_args+=("${extra[@]}")
    cluster_args+=("${extra[@]}")
    alone_args+=("${extra[@]}")
fi

# run_alone ENV...: the suites of SUITES_ALONE one after another, each in a cargo test of
# its own: run together, stack_rerun's `scripts/stack.sh up` checked (and restarted) the
# services while the storm had the database out and its Redis failing over.
run_alone() {
    local rc=0 t
    for t in $SUITES_ALONE; do
        echo "---- $t" >&2
        "$@" RUST_TEST_THREADS="$ALONE_TEST_THREADS" cargo test --no-fail-fast "${alone_args[@]}" "$t" || rc=1
    done
    return "$rc"
}

# The stack and the tests see the same selection (tests read it from .dev/stack.env,
# which a variable of the same name overrides).
single_env=(env SECKILL_REDIS_ENGINE="$SINGLE_ENGINE" SECKILL_REDIS_TOPOLOGY=single)
cluster_env=(env SECKILL_REDIS_ENGINE=valkey SECKILL_REDIS_TOPOLOGY=cluster)

setup_args=()
((run_cluster)) && setup_args=(--valkey)
# The installs (apt-get, PyPI: minutes on a fresh machine, mostly waiting on the network
# and dpkg) run beside the build, which needs none of them; their output is shown once
# the build is done.
SETUP_LOG=$DEV_DIR/logs/setup.log
mkdir -p "${SETUP_LOG%/*}"
(
    t0=$(now_s)
    rc=0
    scripts/setup.sh "${setup_args[@]}" || rc=$?
    echo "     (scripts/setup.sh took $(elapsed_since "$t0") beside the build)"
    exit "$rc"
) >"$SETUP_LOG" 2>&1 &
setup_pid=$!
# build_all: the whole workspace, every target; its output also kept in a log so that a
# failure's cause can be repeated in the summary, the part of a CI log one reads first.
BUILD_LOG=$DEV_DIR/logs/build.log
build_all() {
    cargo build --workspace --all-targets 2> >(tee "$BUILD_LOG" >&2)
}
phase "build (all targets)" build_all || { wait "$setup_pid" || true; exit 1; }
# setup_wait: the installs' outcome and their output.
setup_wait() {
    local rc=0
    wait "$setup_pid" || rc=$?
    cat "$SETUP_LOG" >&2
    return "$rc"
}
phase "setup (beside the build)" setup_wait || exit 1
stack_started=1
# The functions must run the code just built: restart the watch (cheap), keep the rest.
if ((run_single)); then
    phase "stack up" "${single_env[@]}" SECKILL_LAMBDA_RELOAD=0 scripts/stack.sh up --restart-functions || exit 1
    phase "cargo test" "${single_env[@]}" RUST_TEST_THREADS="$SINGLE_TEST_THREADS" cargo test --no-fail-fast "${single_args[@]}" || true
    if ((${#alone_args[@]})); then
        phase "cargo test (own clusters)" run_alone "${single_env[@]}" || true
    fi
fi
# Clippy checks every crate once more (its own check-mode compile of every dependency,
# ~100 s of both cores). It runs beside the cluster pass's tests, which leave the machine
# mostly idle, at the lowest CPU and I/O priority so that those tests keep the cores
# whenever they want them; cargo takes the build directory's lock only while compiling,
# so the tests' own (no-op) build does not wait for clippy. It is done before the suites
# run alone start: those load the machine themselves.
CLIPPY_LOG=$DEV_DIR/logs/clippy.log
clippy_pid=
clippy=(cargo clippy --workspace --all-targets -- -D warnings)
# clippy_beside: starts clippy once the tests run (their binary, tests/tests/it, is up: its
# `cargo test` has checked the build and let go of the lock), or after a minute.
clippy_beside() {
    (
        for _ in $(seq 120); do
            pgrep -f "/debug/deps/it-[0-9a-f]+( |$)" >/dev/null && break
            sleep 0.5
        done
        exec nice -n 19 ionice -c 2 -n 7 "${clippy[@]}"
    ) >"$CLIPPY_LOG" 2>&1 &
    clippy_pid=$!
}
# clippy_wait: clippy's outcome and its output.
clippy_wait() {
    local rc=0
    wait "$clippy_pid" || rc=$?
    cat "$CLIPPY_LOG" >&2
    return "$rc"
}
if ((run_cluster)); then
    # Down and up again on the same ports: MariaDB keeps its data, Redis starts from the
    # Valkey cluster's own folder under .dev/redis.
    stack_down_then_up_as_valkey_cluster() {
        if ((run_single)); then scripts/stack.sh down || return; fi
        "${cluster_env[@]}" SECKILL_LAMBDA_RELOAD=0 scripts/stack.sh up --restart-functions
    }
    if phase "stack up (valkey cluster)" stack_down_then_up_as_valkey_cluster; then
        clippy_beside
        phase "cargo test (valkey cluster)" "${cluster_env[@]}" RUST_TEST_THREADS="$CLUSTER_TEST_THREADS" cargo test --no-fail-fast "${cluster_args[@]}" || true
        # Done before the suites that load the machine themselves start.
        phase "cargo clippy -D warnings (beside the tests)" clippy_wait || true
        if ((${#alone_args[@]})); then
            phase "cargo test (valkey cluster, own clusters)" run_alone "${cluster_env[@]}" || true
        fi
    fi
fi
phase "cargo fmt --check" cargo fmt --all --check || true
if [[ -z $clippy_pid ]]; then
    phase "cargo clippy -D warnings" "${clippy[@]}" || true
fi
((${#FAILED[@]} == 0))
