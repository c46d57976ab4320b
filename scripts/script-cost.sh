#!/usr/bin/env bash
# What one admission costs the Redis server: our admission script
# against the tutorial's script + its INCR and a no-op EVALSHA, on a Redis of its own.
#
#   scripts/script-cost.sh                  5 rounds of 200,000 calls per variant
#   scripts/script-cost.sh --rounds 3 --calls 100000
#   scripts/script-cost.sh --instructions   also count instructions per call (valgrind)
#
# Time: `usec_per_call` of `cmdstat_evalsha` (INFO commandstats), which already holds
# the commands a script runs; the variants alternate within each round and the median
# of the rounds is reported, because a shared machine moves every figure by 20 % or more
# from one run to the next (compare the ratios).
# Instructions (--instructions): the server runs under callgrind, and each variant's
# instructions inside the EVALSHA command are divided by its calls. This count does not
# move with the machine's load, so it shows what a change to a script saves where a
# timing cannot; it is not a time (valgrind runs about 50x slower).
#
# Each variant starts from the same keys: a sale of 100,000,000 units, open, an empty
# buyers record; users are random (redis-benchmark's __rand_int__), so nearly every
# call is an admission. Variants:
#   ours       lua/admit.lua, a voucher without a payment step
#   ours-pay   lua/admit.lua, a voucher with a payment step (one ZADD more)
#   tutorial   lua/bench/tutorial_seckill.lua (the INCR for its order id is measured
#              alone as `incr` and added to it)
#   noop       lua/bench/noop.lua (the floor of any EVALSHA)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ensure_path
cd "$SECKILL_ROOT"

rounds=5
calls=200000
instructions=0
while (($#)); do
    case $1 in
    --rounds)
        rounds=$2
        shift
        ;;
    --calls)
        calls=$2
        shift
        ;;
    --instructions) instructions=1 ;;
    -h | --help)
        sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *) die "unknown argument $1 (see scripts/script-cost.sh --help)" ;;
    esac
    shift
done
[[ $rounds =~ ^[1-9][0-9]*$ && $calls =~ ^[1-9][0-9]*$ ]] || die "--rounds and --calls take positive integers"

server=${SECKILL_REDIS_SERVER:-$(command -v redis-server || true)}
[[ -x $server ]] || die "no redis-server (run scripts/setup.sh, or set SECKILL_REDIS_SERVER)"
command -v redis-benchmark >/dev/null || die "no redis-benchmark (apt-get install redis-tools)"
command -v redis-cli >/dev/null || die "no redis-cli (apt-get install redis-tools)"
if ((instructions)); then
    command -v valgrind >/dev/null && command -v callgrind_control >/dev/null ||
        die "--instructions needs valgrind (apt-get install valgrind)"
fi

work=$(mktemp -d)
port=
server_pid=
cleanup() {
    [[ -n $port ]] && redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
    [[ -n $server_pid ]] && kill "$server_pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# start_server [valgrind prefix...]: a Redis without persistence on a free port.
start_server() {
    port=$(free_port)
    "$@" "$server" --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
        --dir "$work" >"$work/server.log" 2>&1 &
    server_pid=$!
    local i
    for i in $(seq 600); do
        redis-cli -p "$port" PING >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    die "the Redis server did not start (see $work/server.log)"
}
stop_server() {
    redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
    wait "$server_pid" 2>/dev/null || true
    port= server_pid=
}

R() { redis-cli -p "$port" "$@"; }
order_id=1234567890123456789
# prepare VARIANT: fresh keys; prints the redis-benchmark command line of the variant.
prepare() {
    R FLUSHALL >/dev/null
    R HSET 'seckill:{1}:sale' stock 100000000 total 100000000 begins_ms 0 ends_ms 99999999999999 >/dev/null
    R HSETNX 'seckill:{1}:buyers' '-' '-' >/dev/null
    R ZADD 'seckill:{1}:deadlines' 0 '-' >/dev/null
    R SET 'p:seckill:stock:1' 100000000 >/dev/null
    local sha
    case $1 in
    ours | ours-pay)
        [[ $1 == ours-pay ]] && R HSET 'seckill:{1}:sale' pay_ms 900000 rebuy 0 >/dev/null
        sha=$(R SCRIPT LOAD "$(cat lua/admit.lua)")
        # A random order id per call too (redis-benchmark draws each __rand_int__ on its
        # own), as every attempt has its own: with one id for every call, a repeated user
        # would look like a copy of its own attempt (lua/admit.lua marks it, and later
        # calls of that id write nothing), which no real sale does.
        echo "EVALSHA $sha 4 seckill:{1}:sale seckill:{1}:buyers seckill:{1}:orders seckill:{1}:deadlines __rand_int__ __rand_int__"
        ;;
    tutorial)
        sha=$(R SCRIPT LOAD "$(cat lua/bench/tutorial_seckill.lua)")
        echo "EVALSHA $sha 0 1 __rand_int__ $order_id p:"
        ;;
    incr) echo "INCR icr:order:2026:11:26" ;;
    noop)
        sha=$(R SCRIPT LOAD "$(cat lua/bench/noop.lua)")
        echo "EVALSHA $sha 0"
        ;;
    esac
}
# bench N COMMAND...: N calls from 50 clients, random users.
bench() {
    local n=$1
    shift
    redis-benchmark -p "$port" -n "$n" -c 50 -r 100000000 -q "$@" >/dev/null
}
stat_of() { R INFO commandstats | tr -d '\r' | grep "^cmdstat_$1:" | sed 's/.*usec_per_call=\([0-9.]*\).*/\1/'; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

variants=(ours ours-pay tutorial incr noop)
log "server: $("$server" --version | head -1)"
log "time per call (INFO commandstats): $rounds rounds of $calls calls per variant, 50 clients"
start_server
for r in $(seq "$rounds"); do
    line="round $r:"
    for v in "${variants[@]}"; do
        cmd=$(prepare "$v")
        R CONFIG RESETSTAT >/dev/null
        # shellcheck disable=SC2086 # the command line is meant to split into words
        bench "$calls" $cmd
        us=$(stat_of "$([[ $v == incr ]] && echo incr || echo evalsha)")
        echo "$us" >>"$work/$v.us"
        line+=" $v $us"
    done
    echo "$line" >&2
done
stop_server

med() { median <"$work/$1.us"; }
ours=$(med ours) ours_pay=$(med ours-pay) tut=$(med tutorial) incr=$(med incr) noop=$(med noop)
echo
echo "server µs per admission (median of $rounds rounds; INFO commandstats usec_per_call):"
awk -v o="$ours" -v op="$ours_pay" -v t="$tut" -v i="$incr" -v n="$noop" 'BEGIN {
    b = t + i
    printf "  ours                   %6.2f µs   %.2fx the tutorial + INCR (target <= 0.8x)\n", o, o / b
    printf "  ours, payment step     %6.2f µs   %.2fx\n", op, op / b
    printf "  tutorial + INCR        %6.2f µs   (%.2f + %.2f)\n", b, t, i
    printf "  no-op EVALSHA          %6.2f µs\n", n
}'

if ((instructions)); then
    log "instructions per call under callgrind (10,000 calls per variant after 20,000 to warm up)"
    start_server valgrind --tool=callgrind --callgrind-out-file="$work/cg.out"
    for v in "${variants[@]}"; do
        cmd=$(prepare "$v")
        # shellcheck disable=SC2086
        bench 20000 $cmd
        callgrind_control -z "$server_pid" >/dev/null 2>&1
        # shellcheck disable=SC2086
        bench 10000 $cmd
        callgrind_control -d "$v" "$server_pid" >/dev/null 2>&1
        dump=$(ls -t "$work"/cg.out.* | head -1)
        fn=$([[ $v == incr ]] && echo incrCommand || echo evalGenericCommand)
        # awk reads to the end: a grep -m1 would close the pipe early (SIGPIPE, pipefail).
        ir=$(callgrind_annotate --inclusive=yes "$dump" 2>/dev/null |
            awk -v f=":$fn " 'index($0, f) && !done { gsub(",", "", $1); print $1; done = 1 }')
        echo "$v ${ir:-0}" >>"$work/ir"
    done
    stop_server
    echo
    echo "instructions per call (inclusive, inside the command):"
    awk '{ ir[$1] = $2 / 10000 } END {
        b = ir["tutorial"] + ir["incr"]
        printf "  ours                   %8.0f   %.2fx the tutorial + INCR\n", ir["ours"], ir["ours"] / b
        printf "  ours, payment step     %8.0f   %.2fx\n", ir["ours-pay"], ir["ours-pay"] / b
        printf "  tutorial + INCR        %8.0f   (%.0f + %.0f)\n", b, ir["tutorial"], ir["incr"]
        printf "  no-op EVALSHA          %8.0f\n", ir["noop"]
    }' "$work/ir"
fi
