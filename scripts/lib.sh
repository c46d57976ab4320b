# Shared shell helpers for scripts/*.sh. Source it; do not run it.
# shellcheck shell=bash

# Repository root (the folder holding Cargo.toml, scripts/, .dev/).
SECKILL_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck disable=SC2034 # used by the scripts that source this file
DEV_DIR="$SECKILL_ROOT/.dev"

# Colours for messages on a terminal (also used by the sourcing scripts).
if [[ -t 2 && -z "${NO_COLOR:-}" ]]; then
    _c_red=$'\e[31m' _c_grn=$'\e[32m' _c_yel=$'\e[33m' _c_bold=$'\e[1m' _c_off=$'\e[0m'
else
    _c_red='' _c_grn='' _c_yel='' _c_bold='' _c_off=''
fi

log() { printf '%s==>%s %s\n' "$_c_bold" "$_c_off" "$*" >&2; }
ok() { printf '%s ok%s %s\n' "$_c_grn" "$_c_off" "$*" >&2; }
warn() { printf '%swarning:%s %s\n' "$_c_yel" "$_c_off" "$*" >&2; }
err() { printf '%serror:%s %s\n' "$_c_red" "$_c_off" "$*" >&2; }
die() {
    err "$@"
    exit 1
}

# Seconds since the epoch, with fractions where `date` supports them.
now_s() { date +%s.%N 2>/dev/null || date +%s; }
# Elapsed seconds since $1 (a now_s value), printed as e.g. 12.3s.
elapsed_since() { awk -v a="$1" -v b="$(now_s)" 'BEGIN { printf "%.1fs", b - a }'; }

# Make tools installed by pip (cargo-lambda) and cargo findable even when their folders
# are not on PATH yet (fresh machines, `pip install --user`, non-login shells).
ensure_path() {
    local d py
    for d in "$HOME/.cargo/bin" "$HOME/.local/bin" /usr/local/bin; do
        [[ -d $d && ":$PATH:" != *":$d:"* ]] && PATH="$PATH:$d"
    done
    for py in python3 python; do
        if command -v "$py" >/dev/null 2>&1; then
            d="$("$py" -c 'import sysconfig; print(sysconfig.get_path("scripts"))' 2>/dev/null || true)"
            [[ -n $d && -d $d && ":$PATH:" != *":$d:"* ]] && PATH="$PATH:$d"
            d="$("$py" -c 'import site, os; print(os.path.join(site.getuserbase(), "bin"))' 2>/dev/null || true)"
            [[ -n $d && -d $d && ":$PATH:" != *":$d:"* ]] && PATH="$PATH:$d"
            break
        fi
    done
    export PATH
}

# Is something accepting TCP connections on 127.0.0.1:$1?
port_open() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") >/dev/null 2>&1
}

# Who listens on port $1 (best effort, for error messages).
port_owner() {
    if command -v ss >/dev/null 2>&1; then
        ss -ltnpH "sport = :$1" 2>/dev/null | sed -n 's/.*users:((\(.*\))).*/\1/p' | head -n1
    fi
}

# Fields after the command name of /proc/PID/stat ("STATE PPID PGRP ..."); the command
# name may hold spaces and parentheses, so cut after the last ') '.
_proc_stat_tail() {
    local line
    { read -r line <"/proc/$1/stat"; } 2>/dev/null || return 1
    printf '%s' "${line##*) }"
}

# Is pid $1 a live (non-zombie) process?
pid_alive() {
    local rest
    [[ -n ${1:-} ]] || return 1
    rest=$(_proc_stat_tail "$1") || return 1
    [[ -n $rest && ${rest:0:1} != Z && ${rest:0:1} != X ]]
}

# The command line of pid $1, arguments separated by spaces.
pid_cmdline() { tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null || true; }

# Direct children of pid $1 (from /proc; procps may be missing on minimal machines).
pid_children() {
    local parent=$1 f p line rest
    for f in /proc/[0-9]*; do
        p=${f#/proc/}
        { read -r line <"$f/stat"; } 2>/dev/null || continue
        rest=${line##*) }
        rest=${rest#* } # drop STATE
        [[ ${rest%% *} == "$parent" ]] && echo "$p"
    done
    return 0
}

# All descendants of pid $1.
pid_descendants() {
    local c
    for c in $(pid_children "$1"); do
        echo "$c"
        pid_descendants "$c"
    done
}

# Wait until none of the given pids is alive, at most $1 seconds. Returns 1 on timeout.
wait_pids_gone() {
    local timeout=$1 p deadline alive
    shift
    deadline=$((SECONDS + timeout))
    while :; do
        alive=0
        for p in "$@"; do pid_alive "$p" && alive=1; done
        ((alive == 0)) && return 0
        ((SECONDS >= deadline)) && return 1
        sleep 0.2
    done
}

# Load KEY=VALUE lines of file $1 into the environment (exported). Ignores comments.
load_env_file() {
    local line k v
    while IFS= read -r line || [[ -n $line ]]; do
        [[ -z $line || $line == \#* ]] && continue
        k=${line%%=*} v=${line#*=}
        export "$k=$v"
    done <"$1"
}

# --- Redis engine and topology of the local stack -----------------------------------------
# SECKILL_REDIS_ENGINE=redis|valkey (default redis: Debian's redis-server),
# SECKILL_REDIS_TOPOLOGY=single|cluster (default single: one cluster-mode node owning all
# slots), SECKILL_VALKEY_VERSION=9.1|8.1 (default 9.1; only for the valkey engine).
# Sets REDIS_ENGINE, REDIS_TOPOLOGY and VALKEY_VERSION, or dies naming the bad value.
redis_selection() {
    REDIS_ENGINE=${SECKILL_REDIS_ENGINE:-redis}
    REDIS_TOPOLOGY=${SECKILL_REDIS_TOPOLOGY:-single}
    VALKEY_VERSION=${SECKILL_VALKEY_VERSION:-9.1}
    case $REDIS_ENGINE in
    redis | valkey) ;;
    *) die "SECKILL_REDIS_ENGINE=$REDIS_ENGINE: expected redis (Debian's redis-server, the default) or valkey" ;;
    esac
    case $REDIS_TOPOLOGY in
    single | cluster) ;;
    *) die "SECKILL_REDIS_TOPOLOGY=$REDIS_TOPOLOGY: expected single (one node owning all slots, the default) or cluster (3 primaries with 1 replica each)" ;;
    esac
    valkey_full_version "$VALKEY_VERSION" >/dev/null ||
        die "SECKILL_VALKEY_VERSION=$VALKEY_VERSION: expected 9.1 (the default) or 8.1"
}

# The exact Valkey release installed for a version the stack knows (9.1 or 8.1).
valkey_full_version() {
    case $1 in
    9.1) echo 9.1.2 ;;
    8.1) echo 8.1.8 ;;
    *) return 1 ;;
    esac
}

# Where scripts/setup.sh installs valkey-server of version $1 (9.1 or 8.1).
valkey_server_path() {
    printf '%s/seckill/valkey-%s/valkey-server\n' "${XDG_CACHE_HOME:-$HOME/.cache}" "$(valkey_full_version "$1")"
}

# localstripe (the local stack's Stripe), pinned: scripts/setup.sh installs it into a
# virtualenv of its own there.
LOCALSTRIPE_VERSION=1.15.10
localstripe_bin() {
    printf '%s/seckill/localstripe-%s/bin/localstripe\n' "${XDG_CACHE_HOME:-$HOME/.cache}" "$LOCALSTRIPE_VERSION"
}

# moto (the local stack's EventBridge and SQS: order events), pinned: scripts/setup.sh
# installs moto[server] into a virtualenv of its own there (its boto3 makes the bus).
MOTO_VERSION=5.2.5
moto_bin() {
    printf '%s/seckill/moto-%s/bin/moto_server\n' "${XDG_CACHE_HOME:-$HOME/.cache}" "$MOTO_VERSION"
}

# Is $1 an executable server printing version $2 (e.g. 9.1.2) in its --version line?
server_has_version() {
    [[ -x $1 ]] && "$1" --version 2>/dev/null | grep -q " v=$2 "
}
