#!/usr/bin/env bash
# THE test command: installs what is missing, builds, starts the local stack, runs the
# whole test suite against it, then checks formatting and lints.
#
#   scripts/test.sh                      everything
#   scripts/test.sh -p seckill-tests     extra arguments go to `cargo test`
#   scripts/test.sh -- --nocapture       (after `--`: to the test binaries)
#
# The stack is stopped at exit unless SECKILL_KEEP_STACK=1. Exits non-zero if any phase
# failed; fmt and clippy still run after failing tests so one run reports everything.
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ensure_path
cd "$SECKILL_ROOT"

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

summary() {
    local p
    printf '\n%s==== summary%s\n' "$_c_bold" "$_c_off" >&2
    for p in "${PHASES[@]}"; do printf '  %s\n' "$p" >&2; done
    printf '  total %s\n' "$(elapsed_since "$T_START")" >&2
    if ((${#FAILED[@]})); then
        printf '\n%s%sFAILED: %s%s\n' "$_c_red" "$_c_bold" "${FAILED[*]}" "$_c_off" >&2
    else
        printf '\n%s%sALL PASSED%s\n' "$_c_grn" "$_c_bold" "$_c_off" >&2
    fi
}

stack_started=0
on_exit() {
    local rc=$?
    if ((stack_started)); then
        if [[ ${SECKILL_KEEP_STACK:-0} == 1 ]]; then
            log "SECKILL_KEEP_STACK=1: leaving the stack running (scripts/stack.sh down stops it)"
        else
            "$SECKILL_ROOT/scripts/stack.sh" down || err "stopping the stack failed"
        fi
    fi
    summary
    if ((rc == 0 && ${#FAILED[@]})); then rc=1; fi
    exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT TERM

# `cargo test --workspace` unless the caller picked packages.
test_args=(--workspace)
for a in "$@"; do
    [[ $a == -- ]] && break
    case $a in -p | --package | -p* | --package=*) test_args=() ;; esac
done

phase setup scripts/setup.sh || exit 1
phase "build (all targets)" cargo build --workspace --all-targets || exit 1
stack_started=1
# The functions must run the code just built: restart the watch (cheap), keep the rest.
phase "stack up" env SECKILL_LAMBDA_RELOAD=0 scripts/stack.sh up --restart-functions || exit 1
phase "cargo test" cargo test "${test_args[@]}" "$@" || true
phase "cargo fmt --check" cargo fmt --all --check || true
phase "cargo clippy -D warnings" cargo clippy --workspace --all-targets -- -D warnings || true
((${#FAILED[@]} == 0))
