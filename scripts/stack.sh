#!/usr/bin/env bash
# The local stack: Redis (cluster mode), MariaDB, the local Data API server and
# `cargo lambda watch` serving seckill-http and order-drainer.
#
#   scripts/stack.sh up [--restart-functions]   start what is not running, write .dev/stack.env
#   scripts/stack.sh down [--purge]             stop everything (--purge: delete .dev/ too)
#   scripts/stack.sh status                     one line per service (per Redis node)
#
# All state lives under .dev/ (git-ignored): data in .dev/redis/<engine>-<version>-<topology>/
# and .dev/mysql, pids in .dev/pids, logs in .dev/logs (Redis: redis-<port>.log), the
# function environment in .dev/functions.env and the contract file .dev/stack.env
# (written last, once everything answers; see docs/local-stack.md).
#
# Redis (docs/local-stack.md, "Redis topologies and engines"):
#   SECKILL_REDIS_ENGINE=redis|valkey     redis (default): Debian's redis-server; valkey:
#                                         valkey-server 9.1 (scripts/setup.sh installs it)
#   SECKILL_VALKEY_VERSION=9.1|8.1        which Valkey (default 9.1)
#   SECKILL_REDIS_TOPOLOGY=single|cluster single (default): one cluster-mode node owning
#                                         all 16384 slots; cluster: 3 primaries with one
#                                         replica each, 6 processes
# Each engine and topology keeps its own data; `up` with another selection than the one
# running stops the running Redis processes first and says so. With none of these
# variables set, `up` keeps the Redis that runs (engine, version and topology) and says
# so: run again to bring back one service, it never swaps Redis under a running sale.
#
# Ports (override with these variables): Redis SECKILL_REDIS_PORT (16379; cluster: that
# port and the 5 after it; every Redis port + 10000 is its cluster bus port and must be
# free too), MariaDB SECKILL_MYSQL_PORT (13306), Data API SECKILL_DATA_API_PORT (18080),
# cargo lambda watch SECKILL_LAMBDA_PORT (19000), the local API Gateway
# SECKILL_GATEWAY_PORT (19100), the local Stripe (localstripe) SECKILL_STRIPE_PORT (12111),
# the local EventBridge and SQS (moto) SECKILL_EVENTS_PORT (15100).
#
# Order events: moto (PyPI `moto[server]`, AWS's APIs emulated by others) serves
# EventBridge and SQS at EVENTS_ENDPOINT_URL, with the bus EVENT_BUS_NAME, a rule taking
# every event of `seckill.orders` and the SQS queue EVENTS_QUEUE_URL as its target
# (scripts/events-setup.py): the drainer publishes there, a consumer (the tests) reads
# the queue. moto keeps everything in memory: a restart starts an empty bus.
#
# Stripe: localstripe (PyPI; a stateful fake of Stripe's API, scripts/setup.sh installs
# it) serves STRIPE_API_BASE with the test key STRIPE_SECRET_KEY; seckill-http creates
# PaymentIntents there and takes Stripe's events, signed with STRIPE_WEBHOOK_SECRET, at
# POST /payments/stripe. localstripe keeps its objects in memory (started from scratch:
# its one save file is shared by every localstripe on the machine) and sends no
# PaymentIntent events itself: `seckill pay --stripe` and the tests build them from the
# object they fetch, as Stripe would send them.
#
# seckill-http is reached as in AWS, through an API Gateway: tools/api-gateway-local
# matches the routes, builds the payload format 2.0 event (a body that is not text is
# base64-encoded) and invokes the function through cargo lambda watch's Lambda Invoke
# API. That is SECKILL_HTTP_URL; the watch's own function URL (which answers 500 itself
# to a JSON-typed body that is not UTF-8) stays reachable as SECKILL_LAMBDA_URL.
#
# Other knobs:
#   SECKILL_LAMBDA_RELOAD=1      let cargo lambda watch rebuild/restart the functions when
#                                sources change (default 0: the functions run the code of
#                                the last `up`; `up` restarts the watch when their
#                                binaries changed)
#   SECKILL_LAMBDA_CONCURRENCY   instances per function under the watch (default 1)
#   SECKILL_LAMBDA_TIMEOUT       seconds an invocation may take before the watch answers
#                                408 (default: no limit; includes compile time)
#   SECKILL_WARMUP_TIMEOUT       seconds `up` waits for each function's first answer (900)
# Function environment (.dev/functions.env): the stack's addresses (Redis: REDIS_URL, the
# first primary, as the cluster client's seed, and REDIS_CLUSTER=true), plus DRAINER_*,
# REDIS_TIMEOUT_MS and DATA_API_TIMEOUT_MS when set in the environment of `up`, plus the
# KEY=VALUE lines of .dev/functions.extra.env if that file exists. A change (or another
# Redis engine or topology) restarts the watch on the next `up`.
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ensure_path
redis_selection
cd "$SECKILL_ROOT"

# The Redis the stack runs now, when none of the three selection variables is set: `up`
# run again (to bring back a MariaDB that died, say) must not swap the Redis under a
# running sale for the default one, whose data folder is another (every undrained order
# of the running sale would vanish from the drainer's view). Setting any of them is
# asking for that selection, which `up` switches to as before.
adopt_running_redis() {
    local f pid stamp engine version topology
    [[ -z ${SECKILL_REDIS_ENGINE+x}${SECKILL_REDIS_TOPOLOGY+x}${SECKILL_VALKEY_VERSION+x} ]] || return 0
    for f in "$DEV_DIR"/pids/redis.pid "$DEV_DIR"/pids/redis-[0-9]*.pid; do
        [[ -r $f ]] || continue
        pid=$(<"$f")
        pid_alive "$pid" || continue
        stamp=$(cat "${f%.pid}.stamp" 2>/dev/null || true)
        engine=$(sed -n 's/.*engine=\([^ ]*\).*/\1/p' <<<"$stamp")
        version=$(sed -n 's/.*version=\([0-9]*\.[0-9]*\).*/\1/p' <<<"$stamp")
        topology=$(sed -n 's/.*topology=\([^ ]*\).*/\1/p' <<<"$stamp")
        [[ $engine == redis || $engine == valkey ]] || continue
        [[ $topology == single || $topology == cluster ]] || continue
        REDIS_ENGINE=$engine
        REDIS_TOPOLOGY=$topology
        [[ $engine == valkey ]] && valkey_full_version "$version" >/dev/null && VALKEY_VERSION=$version
        ADOPTED_REDIS="$engine $version, $topology topology"
        return 0
    done
}
ADOPTED_REDIS=''
adopt_running_redis

REDIS_PORT=${SECKILL_REDIS_PORT:-16379}
MYSQL_PORT=${SECKILL_MYSQL_PORT:-13306}
DATA_API_PORT=${SECKILL_DATA_API_PORT:-18080}
LAMBDA_PORT=${SECKILL_LAMBDA_PORT:-19000}
GATEWAY_PORT=${SECKILL_GATEWAY_PORT:-19100}
STRIPE_PORT=${SECKILL_STRIPE_PORT:-12111}
EVENTS_PORT=${SECKILL_EVENTS_PORT:-15100}
PAYMENT_GRACE_S=${SECKILL_PAYMENT_GRACE_S:-10}
LAMBDA_RELOAD=${SECKILL_LAMBDA_RELOAD:-0}
LAMBDA_CONCURRENCY=${SECKILL_LAMBDA_CONCURRENCY:-1}
LAMBDA_TIMEOUT=${SECKILL_LAMBDA_TIMEOUT:-}
WARMUP_TIMEOUT=${SECKILL_WARMUP_TIMEOUT:-900}

DB_CLUSTER_ARN=arn:aws:rds:us-east-1:000000000000:cluster:seckill-local
# Two secrets, as in AWS (docs/security.md): the master secret (MariaDB's
# `seckill` user of MYSQL_URL), used by `seckill migrate` only, and the application
# user's secret (seckill_app, SELECT/INSERT/UPDATE on the two tables), which the
# functions use. data-api-local serves both, and answers GetSecretValue for them.
DB_MASTER_SECRET_ARN=arn:aws:secretsmanager:us-east-1:000000000000:secret:seckill-local
DB_APP_SECRET_ARN=arn:aws:secretsmanager:us-east-1:000000000000:secret:seckill-local-app
# The payment webhook's signing secret, served by data-api-local's Secrets Manager.
PAYMENT_WEBHOOK_SECRET_ARN=arn:aws:secretsmanager:us-east-1:000000000000:secret:seckill-local-payment-webhook
# The waiting rooms' entry-token signing secret, served the same way.
ENTRY_TOKEN_SECRET_ARN=arn:aws:secretsmanager:us-east-1:000000000000:secret:seckill-local-entry-token
# Stripe's secret key and webhook endpoint secret, served the same way.
STRIPE_SECRET_KEY_ARN=arn:aws:secretsmanager:us-east-1:000000000000:secret:seckill-local-stripe-key
STRIPE_WEBHOOK_SECRET_ARN=arn:aws:secretsmanager:us-east-1:000000000000:secret:seckill-local-stripe-webhook
DB_SECRET_ARN=$DB_APP_SECRET_ARN
DB_APP_USER=seckill_app
DB_NAME=seckill
AWS_REGION_LOCAL=us-east-1

PID_DIR=$DEV_DIR/pids
LOG_DIR=$DEV_DIR/logs
REDIS_DIR=$DEV_DIR/redis
MYSQL_DIR=$DEV_DIR/mysql
MYSQL_DATA=$MYSQL_DIR/data
STACK_ENV=$DEV_DIR/stack.env
FUNCTIONS_ENV=$DEV_DIR/functions.env
JWT_FILE=$DEV_DIR/jwt-secret
# The payment webhook's signing secrets (`current[,previous]`): made once; write
# `new,old` into it and run `up` again to rotate.
WEBHOOK_FILE=$DEV_DIR/payment-webhook-secret
ENTRY_FILE=$DEV_DIR/entry-token-secret
# Stripe's test key (sk_test_...) and webhook endpoint secret (whsec_...), made once.
STRIPE_KEY_FILE=$DEV_DIR/stripe-secret-key
STRIPE_WEBHOOK_FILE=$DEV_DIR/stripe-webhook-secret
# The application user's password (letters and digits, made once; change it and run `up`
# again to rotate it) and data-api-local's secrets file made from it.
APP_PASSWORD_FILE=$DEV_DIR/app-db-password
DATA_API_SECRETS=$DEV_DIR/data-api-secrets
EVENT_FIXTURE=$SECKILL_ROOT/tests/fixtures/eventbridge-scheduled.json

BIN_DIR=${CARGO_TARGET_DIR:-$SECKILL_ROOT/target}/debug
HTTP_URL=http://127.0.0.1:$GATEWAY_PORT
LAMBDA_URL=http://127.0.0.1:$LAMBDA_PORT/lambda-url/seckill-http
INVOKE_URL=http://127.0.0.1:$LAMBDA_PORT/2015-03-31/functions/order-drainer/invocations
REDIS_URL=redis://127.0.0.1:$REDIS_PORT
MYSQL_URL=mysql://seckill:seckill@127.0.0.1:$MYSQL_PORT/$DB_NAME
DATA_API_URL=http://127.0.0.1:$DATA_API_PORT
STRIPE_API_BASE=http://127.0.0.1:$STRIPE_PORT
EVENTS_ENDPOINT_URL=http://127.0.0.1:$EVENTS_PORT
EVENT_BUS_NAME=seckill-orders
EVENTS_QUEUE_NAME=seckill-order-events
EVENTS_QUEUE_FILE=$DEV_DIR/events-queue-url
# Not a secret (every buyer's browser holds it); localstripe takes any pk_ key.
STRIPE_PUBLISHABLE_KEY=pk_test_seckill_local
# localstripe's stand-in for Stripe.js (https://js.stripe.com/v3/ in AWS).
STRIPE_JS_URL=$STRIPE_API_BASE/js.stripe.com/v3/

# Redis nodes: one (service `redis`) or six (`redis-1` .. `redis-6`, on consecutive
# ports; the first three are created as the primaries).
if [[ $REDIS_TOPOLOGY == cluster ]]; then
    REDIS_NODE_COUNT=6
    REDIS_NODE_TIMEOUT_MS=3000
else
    REDIS_NODE_COUNT=1
    REDIS_NODE_TIMEOUT_MS=5000
fi
# Set by resolve_redis_server: the server binary, its version, where its data lives.
REDIS_SERVER='' REDIS_SERVER_VERSION='' REDIS_DATA=''

# Unix sockets paths are limited to ~107 bytes; fall back to /tmp for deep checkouts.
MYSQL_SOCK=$MYSQL_DIR/mysqld.sock
if ((${#MYSQL_SOCK} > 100)); then
    MYSQL_SOCK=/tmp/seckill-mysqld-$(printf '%s' "$SECKILL_ROOT" | cksum | cut -d' ' -f1).sock
fi
MYSQL_ADMIN_USER=$(id -un)

# The Redis services of the selected topology, one per line.
redis_services() {
    local i
    if ((REDIS_NODE_COUNT == 1)); then
        echo redis
    else
        for ((i = 1; i <= REDIS_NODE_COUNT; i++)); do echo "redis-$i"; done
    fi
}
# The Redis services that have a pid file, whatever topology started them, one per line.
redis_services_on_record() {
    local f
    for f in "$PID_DIR"/redis.pid "$PID_DIR"/redis-[0-9]*.pid; do
        [[ -e $f ]] || continue
        f=${f##*/}
        echo "${f%.pid}"
    done
}
# 127.0.0.1:port of every node of the selected topology, comma-separated.
redis_nodes_csv() {
    local i nodes=()
    for ((i = 0; i < REDIS_NODE_COUNT; i++)); do nodes+=("127.0.0.1:$((REDIS_PORT + i))"); done
    (
        IFS=,
        echo "${nodes[*]}"
    )
}

svc_port() {
    case $1 in
    redis) echo "$REDIS_PORT" ;;
    redis-[1-9]*) echo $((REDIS_PORT + ${1#redis-} - 1)) ;;
    mysql) echo "$MYSQL_PORT" ;;
    data-api) echo "$DATA_API_PORT" ;;
    lambda) echo "$LAMBDA_PORT" ;;
    gateway) echo "$GATEWAY_PORT" ;;
    stripe) echo "$STRIPE_PORT" ;;
    events) echo "$EVENTS_PORT" ;;
    esac
}
svc_port_var() {
    case $1 in
    redis | redis-*) echo SECKILL_REDIS_PORT ;;
    mysql) echo SECKILL_MYSQL_PORT ;;
    data-api) echo SECKILL_DATA_API_PORT ;;
    lambda) echo SECKILL_LAMBDA_PORT ;;
    gateway) echo SECKILL_GATEWAY_PORT ;;
    stripe) echo SECKILL_STRIPE_PORT ;;
    events) echo SECKILL_EVENTS_PORT ;;
    esac
}
# A word the process's command line must contain for a pid file to be believed.
svc_signature() {
    case $1 in
    redis | redis-*) echo redis-server ;;
    mysql) echo mariadbd ;;
    data-api) echo data-api-local ;;
    lambda) echo cargo-lambda ;;
    gateway) echo api-gateway-local ;;
    stripe) echo localstripe ;;
    events) echo moto_server ;;
    esac
}
svc_log() {
    case $1 in
    redis | redis-*) echo "$LOG_DIR/redis-$(svc_port "$1").log" ;;
    *) echo "$LOG_DIR/$1.log" ;;
    esac
}

# The pid of our running service $1, or nothing.
svc_pid() {
    local f=$PID_DIR/$1.pid pid sig cmd
    [[ -r $f ]] || return 0
    pid=$(<"$f")
    pid_alive "$pid" || return 0
    sig=$(svc_signature "$1")
    cmd=$(pid_cmdline "$pid")
    # mariadbd may be installed as mysqld; a Redis node may be valkey-server.
    if [[ $cmd == *"$sig"* || ($1 == mysql && $cmd == *mysqld*) ||
        ($1 == redis* && $cmd == *valkey-server*) ]]; then
        echo "$pid"
    fi
}

# Print the end of service $1's log (for failures).
show_log() {
    local log
    log=$(svc_log "$1")
    if [[ -s $log ]]; then
        err "last lines of $log:"
        tail -n "${2:-40}" "$log" | sed 's/^/    | /' >&2
    fi
}

# fail SERVICE MESSAGE HINT
fail() {
    err "$2"
    show_log "$1"
    [[ -n ${3:-} ]] && printf '%shint:%s %s\n' "$_c_yel" "$_c_off" "$3" >&2
    exit 1
}

# Refuse to start service $1 when something else already listens on its port (for a
# Redis node also on its cluster bus port, the port + 10000).
check_port_free() {
    local port var owner p what n=0 also=''
    port=$(svc_port "$1")
    var=$(svc_port_var "$1")
    [[ $1 == redis-* ]] && n=$((${1#redis-} - 1))
    if [[ $1 == redis* ]] && ((REDIS_NODE_COUNT > 1)); then
        also="
(the $REDIS_TOPOLOGY topology uses $var and the $((REDIS_NODE_COUNT - 1)) ports after it, $REDIS_PORT..$((REDIS_PORT + REDIS_NODE_COUNT - 1)), and each port + 10000 for its cluster bus)"
    fi
    for p in "$port" $([[ $1 == redis* ]] && echo $((port + 10000))); do
        if port_open "$p"; then
            owner=$(port_owner "$p")
            what=$var
            ((n > 0)) && what="$var + $n"
            [[ $p != "$port" ]] && what="the Redis cluster bus port, $what + 10000"
            [[ $what != "$var" ]] && p="$p ($what)"
            die "port $p (for $1) is already in use${owner:+ by $owner}, not by this stack.
Stop that process, or pick another port: $var=<free port> scripts/stack.sh up$also"
        fi
    done
}

# start_bg SERVICE STAMP COMMAND... : run COMMAND in its own session, log to
# .dev/logs/SERVICE.log, record pid, port and stamp.
start_bg() {
    local name=$1 stamp=$2 log pid
    shift 2
    log=$(svc_log "$name")
    [[ -f $log ]] && mv -f "$log" "$log.1"
    printf '=== %s: %s\n' "$(date -u +%FT%TZ)" "$*" >"$log"
    # Not a process-group leader here, so setsid does not fork: $! is the service.
    # fd 9 is the stack lock: services must not inherit it.
    setsid "$@" >>"$log" 2>&1 </dev/null 9>&- &
    pid=$!
    echo "$pid" >"$PID_DIR/$name.pid"
    printf '%s\n' "$stamp" >"$PID_DIR/$name.stamp"
    svc_port "$name" >"$PID_DIR/$name.port"
}

# stop_svc SERVICE SIGNAL TIMEOUT: signal our process, wait for it and its descendants,
# then SIGKILL what is left.
stop_svc() {
    local name=$1 sig=$2 timeout=$3 pid kids
    pid=$(svc_pid "$name")
    if [[ -z $pid ]]; then
        rm -f "$PID_DIR/$name.pid" "$PID_DIR/$name.stamp" "$PID_DIR/$name.port"
        return 0
    fi
    kids=$(pid_descendants "$pid" | tr '\n' ' ')
    log "stopping $name (pid $pid${kids:+, children $kids})"
    kill "-$sig" "$pid" 2>/dev/null || true
    # shellcheck disable=SC2086
    if ! wait_pids_gone "$timeout" "$pid" $kids; then
        warn "$name did not stop within ${timeout}s after SIG$sig; sending SIGKILL"
        kids="$kids $(pid_descendants "$pid" | tr '\n' ' ')"
        # shellcheck disable=SC2086
        kill -KILL "$pid" $kids 2>/dev/null || true
        # shellcheck disable=SC2086
        wait_pids_gone 10 "$pid" $kids || warn "$name (pid $pid) is still there"
    fi
    rm -f "$PID_DIR/$name.pid" "$PID_DIR/$name.stamp" "$PID_DIR/$name.port"
}

stop_service() {
    case $1 in
    lambda) stop_svc lambda INT 20 ;;
    mysql) stop_svc mysql TERM 60 ;;
    *) stop_svc "$1" TERM 15 ;;
    esac
}

# running_ok SERVICE STAMP: 0 if our service runs on the wanted port with the wanted
# stamp; restarts (stops) it when port or stamp changed.
running_ok() {
    local name=$1 stamp=$2 pid
    pid=$(svc_pid "$name")
    [[ -n $pid ]] || return 1
    if [[ "$(cat "$PID_DIR/$name.port" 2>/dev/null)" != "$(svc_port "$name")" ||
        "$(cat "$PID_DIR/$name.stamp" 2>/dev/null)" != "$stamp" ]]; then
        log "$name (pid $pid) runs with other settings or an older binary: restarting it"
        stop_service "$name"
        return 1
    fi
    return 0
}

# wait_port SERVICE SECONDS: wait until our process listens, or fail with its log.
wait_port() {
    local name=$1 secs=$2 port deadline pid
    port=$(svc_port "$name")
    pid=$(<"$PID_DIR/$name.pid")
    deadline=$((SECONDS + secs))
    until port_open "$port"; do
        pid_alive "$pid" || fail "$name" "$name exited during startup (pid $pid)" "${3:-}"
        ((SECONDS < deadline)) || fail "$name" "$name did not listen on 127.0.0.1:$port within ${secs}s" "${3:-}"
        sleep 0.2
    done
}

file_stamp() {
    local f
    for f in "$@"; do
        if [[ -e $f ]]; then stat -c '%n %Y %s' "$f"; else echo "$f missing"; fi
    done
}

# ----------------------------------------------------------------------------- redis
# redis-cli for the node on port $1 (Debian's redis-cli drives Valkey too).
node_cli() {
    local port=$1
    shift
    redis-cli -h 127.0.0.1 -p "$port" "$@"
}
# Field $2 of the `INFO`-style text on stdin ("key:value" lines).
info_field() { tr -d '\r' | sed -n "s/^$1:\\(.*\\)/\\1/p" | head -n1; }

# A path as shown in messages: relative to the repository when inside it.
rel() { printf '%s\n' "${1#"$SECKILL_ROOT"/}"; }

# The command that brings up the selected Redis again (for hints).
up_command() {
    local env=''
    [[ $REDIS_ENGINE != redis ]] && env+="SECKILL_REDIS_ENGINE=$REDIS_ENGINE "
    [[ $REDIS_ENGINE == valkey && $VALKEY_VERSION != 9.1 ]] && env+="SECKILL_VALKEY_VERSION=$VALKEY_VERSION "
    [[ $REDIS_TOPOLOGY != single ]] && env+="SECKILL_REDIS_TOPOLOGY=$REDIS_TOPOLOGY "
    echo "${env}scripts/stack.sh up"
}

# Sets REDIS_SERVER (absolute path), REDIS_SERVER_VERSION and REDIS_DATA, the data folder
# of this engine, version and topology: .dev/redis/<engine>-<major.minor>-<topology>, so
# that no server is ever handed files another engine or version wrote.
resolve_redis_server() {
    local full
    case $REDIS_ENGINE in
    redis)
        REDIS_SERVER=$(command -v redis-server) || die "redis-server not found: run scripts/setup.sh"
        [[ $REDIS_SERVER == /* ]] || REDIS_SERVER=$PWD/$REDIS_SERVER
        ;;
    valkey)
        full=$(valkey_full_version "$VALKEY_VERSION")
        REDIS_SERVER=$(valkey_server_path "$VALKEY_VERSION")
        server_has_version "$REDIS_SERVER" "$full" ||
            die "valkey-server $full is not installed at $REDIS_SERVER: run scripts/setup.sh --valkey (SECKILL_VALKEY_VERSION=$VALKEY_VERSION)"
        ;;
    esac
    REDIS_SERVER_VERSION=$("$REDIS_SERVER" --version | sed -n 's/.* v=\([0-9][^ ]*\).*/\1/p')
    [[ -n $REDIS_SERVER_VERSION ]] || die "$REDIS_SERVER --version does not name a version: $("$REDIS_SERVER" --version 2>&1 | head -n1)"
    REDIS_DATA=$REDIS_DIR/$REDIS_ENGINE-${REDIS_SERVER_VERSION%.*}-$REDIS_TOPOLOGY
}

redis_node_dir() { echo "$REDIS_DATA/node-$1"; }

# "valkey 9.1.2, cluster topology" from a Redis service stamp.
describe_redis_stamp() {
    local engine version topology
    engine=$(sed -n 's/.*engine=\([^ ]*\).*/\1/p' <<<"$1")
    version=$(sed -n 's/.*version=\([^ ]*\).*/\1/p' <<<"$1")
    topology=$(sed -n 's/.*topology=\([^ ]*\).*/\1/p' <<<"$1")
    if [[ -z $engine ]]; then
        echo "redis-server started by an older scripts/stack.sh"
    else
        echo "$engine $version, $topology topology"
    fi
}

# Stop every Redis node this stack has a pid file for, whatever topology started it, and
# the nodes of the selected topology; in parallel (each stops in well under a second).
stop_redis_all() {
    local s stoppers=()
    for s in $({
        redis_services_on_record
        redis_services
    } | sort -u); do
        stop_service "$s" &
        stoppers+=($!)
    done
    ((${#stoppers[@]} == 0)) || wait "${stoppers[@]}"
}

# start_redis_node SERVICE STAMP
start_redis_node() {
    local name=$1 stamp=$2 port dir
    port=$(svc_port "$name")
    dir=$(redis_node_dir "$port")
    mkdir -p "$dir"
    start_bg "$name" "$stamp" "$REDIS_SERVER" \
        --bind 127.0.0.1 --port "$port" --protected-mode yes \
        --daemonize no --logfile '' --dir "$dir" \
        --appendonly yes --appendfsync everysec --save '' \
        --cluster-enabled yes --cluster-config-file nodes.conf \
        --cluster-announce-ip 127.0.0.1 --cluster-node-timeout "$REDIS_NODE_TIMEOUT_MS" \
        --cluster-require-full-coverage yes
}

# A node that exited or never answered: say which data folder it was given and how to
# start afresh (a server refuses files written by another engine or version, or damaged).
redis_node_failed() {
    local name=$1 what=$2 port dir reset log hint
    port=$(svc_port "$name")
    dir=$(redis_node_dir "$port")
    log=$(svc_log "$name")
    # The nodes of a cluster are created together: start that whole topology afresh.
    reset=$dir
    ((REDIS_NODE_COUNT > 1)) && reset=$REDIS_DATA
    if grep -qi 'address already in use' "$log" 2>/dev/null; then
        hint="another process took port $port (or ${port}+10000) meanwhile: stop it, or pick other ports (SECKILL_REDIS_PORT=<free port> $(up_command))"
    elif grep -qiE "bad file format|unrecognized rdb|can't handle rdb|wrong signature|unrecoverable error|corrupt|unexpected end of file|truncated|nodes\.conf|manifest" "$log" 2>/dev/null; then
        what="$what: it refuses its data (its log below)"
        hint="that data was written by another engine or version, or is damaged. Start Redis afresh: scripts/stack.sh down && rm -rf $(rel "$reset") && $(up_command)
(or reset everything local: scripts/stack.sh down --purge). Redis then loses its sales; MariaDB keeps vouchers and orders, and the functions repair a voucher whose Redis state is missing on its next request."
    else
        hint="if the log above says the server cannot read its data (AOF, RDB or nodes.conf written by another engine or version, or damaged), start Redis afresh: scripts/stack.sh down && rm -rf $(rel "$reset") && $(up_command)
(or reset everything local: scripts/stack.sh down --purge). Redis then loses its sales; MariaDB keeps vouchers and orders, and the functions repair a voucher whose Redis state is missing on its next request."
    fi
    fail "$name" "$(basename "$REDIS_SERVER") $REDIS_SERVER_VERSION ($name, 127.0.0.1:$port, data in $(rel "$dir")) $what" "$hint"
}

# wait_redis_node SERVICE STAMP: until the node answers PING (after loading its data).
# A port in the ephemeral range (see ephemeral_overlap) can be held for a moment as the
# local end of some outgoing connection, where connecting finds nobody listening but
# binding fails: then the node is started again, a few times.
wait_redis_node() {
    local name=$1 stamp=$2 port deadline pid tries=0
    port=$(svc_port "$name")
    pid=$(<"$PID_DIR/$name.pid")
    deadline=$((SECONDS + 60))
    until [[ "$(node_cli "$port" ping 2>/dev/null)" == PONG ]]; do
        if ! pid_alive "$pid"; then
            if ((tries < 10)) && grep -qi 'address already in use' "$(svc_log "$name")" 2>/dev/null &&
                ! port_open "$port" && ! port_open $((port + 10000)); then
                tries=$((tries + 1))
                warn "$name: port $port or $((port + 10000)) was taken for a moment (the local end of another connection?); starting it again ($tries/10)"
                sleep 1
                start_redis_node "$name" "$stamp"
                pid=$(<"$PID_DIR/$name.pid")
                continue
            fi
            redis_node_failed "$name" "exited during startup"
        fi
        ((SECONDS < deadline)) || redis_node_failed "$name" "did not answer PING within 60s"
        sleep 0.2
    done
}

# Warn when Redis ports fall in the kernel's ephemeral port range: any outgoing
# connection may then hold one of them for a while as its local end.
ephemeral_overlap() {
    local lo hi first last
    read -r lo hi </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || return 0
    first=$REDIS_PORT
    last=$((REDIS_PORT + REDIS_NODE_COUNT - 1 + 10000))
    if ((last >= lo && first <= hi)); then
        warn "Redis ports $REDIS_PORT..$((REDIS_PORT + REDIS_NODE_COUNT - 1)) and their cluster bus ports $((REDIS_PORT + 10000))..$last overlap the ephemeral port range $lo-$hi (/proc/sys/net/ipv4/ip_local_port_range): an outgoing connection can hold one for a moment. A SECKILL_REDIS_PORT below $((lo - 10000 - REDIS_NODE_COUNT + 1)) avoids that."
    fi
}

# The first reason the selected topology is not ready yet, or nothing when every node
# reports cluster_state:ok and knows all nodes, there are 3 primaries (cluster), every
# primary has its replica online and every replica its link to its primary up.
redis_not_ready() {
    local i port info known state role masters=0 slaves link
    for ((i = 0; i < REDIS_NODE_COUNT; i++)); do
        port=$((REDIS_PORT + i))
        info=$(node_cli "$port" cluster info 2>/dev/null) || {
            echo "127.0.0.1:$port does not answer CLUSTER INFO"
            return
        }
        state=$(info_field cluster_state <<<"$info")
        known=$(info_field cluster_known_nodes <<<"$info")
        [[ $state == ok ]] || {
            echo "127.0.0.1:$port has cluster_state:$state"
            return
        }
        [[ $known == "$REDIS_NODE_COUNT" ]] || {
            echo "127.0.0.1:$port knows $known of $REDIS_NODE_COUNT nodes"
            return
        }
        ((REDIS_NODE_COUNT > 1)) || continue
        info=$(node_cli "$port" info replication 2>/dev/null)
        role=$(info_field role <<<"$info")
        case $role in
        master)
            masters=$((masters + 1))
            slaves=$(info_field connected_slaves <<<"$info")
            if [[ ${slaves:-0} -lt 1 ]] || ! info_field slave0 <<<"$info" | grep -q 'state=online'; then
                echo "primary 127.0.0.1:$port has no replica online yet ($(info_field slave0 <<<"$info"))"
                return
            fi
            ;;
        slave)
            link=$(info_field master_link_status <<<"$info")
            [[ $link == up ]] || {
                echo "replica 127.0.0.1:$port: master_link_status:$link"
                return
            }
            ;;
        *)
            echo "127.0.0.1:$port has role '$role'"
            return
            ;;
        esac
    done
    if ((REDIS_NODE_COUNT > 1 && masters != REDIS_NODE_COUNT / 2)); then
        echo "$masters primaries instead of $((REDIS_NODE_COUNT / 2))"
    fi
}

wait_redis_ready() {
    local deadline problem
    deadline=$((SECONDS + 90))
    while problem=$(redis_not_ready) && [[ -n $problem ]]; do
        if ((SECONDS >= deadline)); then
            err "the Redis $REDIS_TOPOLOGY topology is not ready after 90s: $problem"
            show_log "$(redis_services | head -n1)" 20
            die "see .dev/logs/redis-<port>.log; to start Redis afresh: scripts/stack.sh down && rm -rf $(rel "$REDIS_DATA") && $(up_command)"
        fi
        sleep 0.3
    done
}

# Slots of a fresh single node: all of them. A fresh cluster: redis-cli --cluster create
# (3 primaries, one replica each). A half-made cluster is refused with the way out.
form_redis_cluster() {
    local i port info known assigned fresh=0 formed=0 odd=() addrs=() log=$LOG_DIR/redis-cluster-create.log
    for ((i = 0; i < REDIS_NODE_COUNT; i++)); do
        port=$((REDIS_PORT + i))
        addrs+=("127.0.0.1:$port")
        info=$(node_cli "$port" cluster info) || fail "$(redis_services | sed -n "$((i + 1))p")" "CLUSTER INFO failed on 127.0.0.1:$port"
        known=$(info_field cluster_known_nodes <<<"$info")
        assigned=$(info_field cluster_slots_assigned <<<"$info")
        if [[ $known == 1 && $assigned == 0 ]]; then
            fresh=$((fresh + 1))
        elif [[ $known == "$REDIS_NODE_COUNT" && ($REDIS_NODE_COUNT -gt 1 || $assigned == 16384) ]]; then
            formed=$((formed + 1))
        else
            odd+=("127.0.0.1:$port knows $known nodes and sees $assigned of 16384 slots assigned")
        fi
    done
    if ((formed == REDIS_NODE_COUNT)); then
        return 0
    fi
    if ((fresh == REDIS_NODE_COUNT)); then
        if ((REDIS_NODE_COUNT == 1)); then
            log "assigning all 16384 slots to the single cluster node"
            [[ "$(node_cli "$REDIS_PORT" cluster addslotsrange 0 16383)" == OK ]] ||
                fail redis "CLUSTER ADDSLOTSRANGE 0 16383 failed"
        else
            log "creating the cluster: primaries ${addrs[*]:0:3}, one replica each on ${addrs[*]:3} (redis-cli --cluster create, log in $(rel "$log"))"
            if ! redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes \
                >"$log" 2>&1 </dev/null; then
                err "redis-cli --cluster create failed; last lines of $(rel "$log"):"
                tail -n 30 "$log" | sed 's/^/    | /' >&2
                die "to start Redis afresh: scripts/stack.sh down && rm -rf $(rel "$REDIS_DATA") && $(up_command)"
            fi
        fi
        return 0
    fi
    ((fresh > 0)) && odd+=("$fresh node(s) have no cluster state at all")
    err "the Redis $REDIS_TOPOLOGY topology in $(rel "$REDIS_DATA") is neither fresh nor complete:"
    printf '    | %s\n' "${odd[@]}" >&2
    die "its nodes must be created together; start Redis afresh: scripts/stack.sh down && rm -rf $(rel "$REDIS_DATA") && $(up_command)"
}

# After a failover (a test, a crash) a primary's former replica leads: make the first
# three nodes the primaries again, so REDIS_URL (the first node) names a primary.
restore_redis_primaries() {
    local i port moved=()
    for ((i = 0; i < REDIS_NODE_COUNT / 2; i++)); do
        port=$((REDIS_PORT + i))
        if [[ "$(node_cli "$port" role 2>/dev/null | head -n1 | tr -d '\r')" == slave ]]; then
            moved+=("$port")
        fi
    done
    ((${#moved[@]})) || return 0
    log "$(printf '127.0.0.1:%s ' "${moved[@]}")ran as replica(s) after a failover: CLUSTER FAILOVER to make the first $((REDIS_NODE_COUNT / 2)) nodes the primaries again"
    for port in "${moved[@]}"; do
        [[ "$(node_cli "$port" cluster failover | tr -d '\r')" == OK ]] ||
            die "CLUSTER FAILOVER on 127.0.0.1:$port failed"
    done
    local deadline=$((SECONDS + 30))
    for port in "${moved[@]}"; do
        until [[ "$(node_cli "$port" role 2>/dev/null | head -n1 | tr -d '\r')" == master ]]; do
            ((SECONDS < deadline)) || die "127.0.0.1:$port did not become a primary within 30s after CLUSTER FAILOVER"
            sleep 0.2
        done
    done
    wait_redis_ready
}

# Files of the layout before engines and topologies had their own folders.
warn_legacy_redis_data() {
    local f old=()
    for f in nodes.conf appendonlydir dump.rdb; do
        [[ -e $REDIS_DIR/$f ]] && old+=("$(rel "$REDIS_DIR/$f")")
    done
    ((${#old[@]})) || return 0
    warn "${old[*]}: Redis data of an older scripts/stack.sh, no longer used (each engine and topology keeps its own under .dev/redis/<engine>-<version>-<topology>/); delete it: rm -rf ${old[*]}"
}

up_redis() {
    local stamp s pid names=() running=() stale=() old_stamp='' old_data to_start=() what
    resolve_redis_server
    stamp="engine=$REDIS_ENGINE version=$REDIS_SERVER_VERSION topology=$REDIS_TOPOLOGY server=$REDIS_SERVER data=$REDIS_DATA"
    mapfile -t names < <(redis_services)
    # Something of another engine, version, topology or port running? Stop all of it
    # first: a cluster is switched as a whole, and its nodes' ports overlap.
    for s in $(redis_services_on_record); do
        pid=$(svc_pid "$s")
        [[ -n $pid ]] || continue
        running+=("$s")
        if ! printf '%s\n' "${names[@]}" | grep -qx "$s" ||
            [[ "$(cat "$PID_DIR/$s.port" 2>/dev/null)" != "$(svc_port "$s")" ||
            "$(cat "$PID_DIR/$s.stamp" 2>/dev/null)" != "$stamp" ]]; then
            stale+=("$s")
            old_stamp=$(cat "$PID_DIR/$s.stamp" 2>/dev/null || true)
        fi
    done
    if ((${#stale[@]})); then
        what="$(describe_redis_stamp "$old_stamp") on port $(cat "$PID_DIR/${stale[0]}.port" 2>/dev/null || echo '?')"
        old_data=$(sed -n 's/.*data=\([^ ]*\).*/\1/p' <<<"$old_stamp")
        log "Redis runs as $what (${#running[@]} process(es)); switching to $REDIS_ENGINE $REDIS_SERVER_VERSION, $REDIS_TOPOLOGY topology: stopping the running Redis first.
    Its data stays in $(rel "${old_data:-$REDIS_DIR}") for a later switch back; this one uses $(rel "$REDIS_DATA").
    MariaDB keeps its data: a voucher this Redis does not hold is repaired from the database on its next request."
        stop_redis_all
    fi
    warn_legacy_redis_data
    mkdir -p "$REDIS_DATA"
    for s in "${names[@]}"; do
        [[ -n $(svc_pid "$s") ]] || to_start+=("$s")
    done
    if ((${#to_start[@]})); then
        ephemeral_overlap
        for s in "${to_start[@]}"; do check_port_free "$s"; done
        log "starting $(basename "$REDIS_SERVER") $REDIS_SERVER_VERSION, $REDIS_TOPOLOGY topology, on $(for s in "${to_start[@]}"; do printf '127.0.0.1:%s ' "$(svc_port "$s")"; done)(cluster mode, AOF everysec, data in $(rel "$REDIS_DATA"))"
        for s in "${to_start[@]}"; do start_redis_node "$s" "$stamp"; done
        for s in "${to_start[@]}"; do wait_redis_node "$s" "$stamp"; done
    else
        ok "redis already running ($REDIS_ENGINE $REDIS_SERVER_VERSION, $REDIS_TOPOLOGY, port $REDIS_PORT$( ((REDIS_NODE_COUNT > 1)) && echo "..$((REDIS_PORT + REDIS_NODE_COUNT - 1))"))"
    fi
    form_redis_cluster
    wait_redis_ready
    ((REDIS_NODE_COUNT == 1)) || restore_redis_primaries
    if ((REDIS_NODE_COUNT == 1)); then
        ok "redis     127.0.0.1:$REDIS_PORT cluster_state:ok ($REDIS_ENGINE $REDIS_SERVER_VERSION, one node owning all slots)"
    else
        ok "redis     $(redis_nodes_csv) cluster_state:ok ($REDIS_ENGINE $REDIS_SERVER_VERSION, 3 primaries with one replica each)"
    fi
}

# ----------------------------------------------------------------------------- mysql
mariadbd_bin() {
    local c
    for c in mariadbd /usr/sbin/mariadbd mysqld /usr/sbin/mysqld; do
        if command -v "$c" >/dev/null 2>&1; then
            command -v "$c"
            return
        fi
    done
    die "mariadbd not found: run scripts/setup.sh"
}

mysql_root() { mariadb --no-defaults -u"$MYSQL_ADMIN_USER" --socket="$MYSQL_SOCK" "$@"; }

up_mysql() {
    local bin stamp deadline tmp
    bin=$(mariadbd_bin)
    stamp="$bin $MYSQL_SOCK"
    mkdir -p "$MYSQL_DIR"
    if running_ok mysql "$stamp"; then
        ok "mariadb already running (pid $(svc_pid mysql), port $MYSQL_PORT)"
    else
        check_port_free mysql
        if [[ ! -d $MYSQL_DATA/mysql ]]; then
            log "initialising MariaDB data directory .dev/mysql/data"
            tmp=$MYSQL_DATA.init
            rm -rf "$tmp"
            mkdir -p "$tmp" "$LOG_DIR"
            if ! mariadb-install-db --no-defaults --datadir="$tmp" --user="$MYSQL_ADMIN_USER" \
                --auth-root-authentication-method=socket --skip-test-db --skip-name-resolve \
                >"$LOG_DIR/mysql-init.log" 2>&1 </dev/null; then
                err "mariadb-install-db failed; last lines of $LOG_DIR/mysql-init.log:"
                tail -n 30 "$LOG_DIR/mysql-init.log" | sed 's/^/    | /' >&2
                exit 1
            fi
            rm -rf "$MYSQL_DATA"
            mv "$tmp" "$MYSQL_DATA"
        fi
        rm -f "$MYSQL_SOCK" "$MYSQL_SOCK.lock"
        log "starting mariadbd on 127.0.0.1:$MYSQL_PORT (data in .dev/mysql)"
        start_bg mysql "$stamp" "$bin" --no-defaults \
            --user="$MYSQL_ADMIN_USER" \
            --datadir="$MYSQL_DATA" \
            --socket="$MYSQL_SOCK" \
            --pid-file="$MYSQL_DIR/mariadbd.pid" \
            --port="$MYSQL_PORT" --bind-address=127.0.0.1 \
            --skip-name-resolve --skip-log-bin \
            --character-set-server=utf8mb4 --collation-server=utf8mb4_general_ci \
            --default-time-zone=+00:00 \
            --max-connections=1000 \
            --performance-schema=OFF \
            --innodb-buffer-pool-size=128M --innodb-log-file-size=64M \
            --innodb-flush-log-at-trx-commit=2 --innodb-use-native-aio=0
        deadline=$((SECONDS + 90))
        until mariadb-admin --no-defaults -u"$MYSQL_ADMIN_USER" --socket="$MYSQL_SOCK" \
            --connect-timeout=2 ping >/dev/null 2>&1; do
            pid_alive "$(<"$PID_DIR/mysql.pid")" || fail mysql "mariadbd exited during startup" \
                "if .dev/mysql/data is damaged: scripts/stack.sh down --purge && scripts/stack.sh up"
            ((SECONDS < deadline)) || fail mysql "mariadbd did not answer within 90s"
            sleep 0.3
        done
        wait_port mysql 30
    fi
    mysql_root <<SQL || fail mysql "creating the database and user failed"
CREATE DATABASE IF NOT EXISTS \`$DB_NAME\` CHARACTER SET utf8mb4;
CREATE USER IF NOT EXISTS 'seckill'@'localhost' IDENTIFIED BY 'seckill';
CREATE USER IF NOT EXISTS 'seckill'@'127.0.0.1' IDENTIFIED BY 'seckill';
CREATE USER IF NOT EXISTS 'seckill'@'%' IDENTIFIED BY 'seckill';
ALTER USER 'seckill'@'localhost' IDENTIFIED BY 'seckill';
ALTER USER 'seckill'@'127.0.0.1' IDENTIFIED BY 'seckill';
ALTER USER 'seckill'@'%' IDENTIFIED BY 'seckill';
GRANT ALL PRIVILEGES ON \`seckill%\`.* TO 'seckill'@'localhost' WITH GRANT OPTION;
GRANT ALL PRIVILEGES ON \`seckill%\`.* TO 'seckill'@'127.0.0.1' WITH GRANT OPTION;
GRANT ALL PRIVILEGES ON \`seckill%\`.* TO 'seckill'@'%' WITH GRANT OPTION;
-- Like Aurora's master user: it makes the application user (seckill migrate) and the
-- tests' users, and may read their grants.
GRANT CREATE USER ON *.* TO 'seckill'@'localhost', 'seckill'@'127.0.0.1', 'seckill'@'%';
GRANT SELECT ON mysql.* TO 'seckill'@'localhost', 'seckill'@'127.0.0.1', 'seckill'@'%';
DROP USER IF EXISTS ''@'localhost';
FLUSH PRIVILEGES;
SQL
    # The password through the environment, never on a command line (`ps` shows those).
    MYSQL_PWD=seckill mariadb --no-defaults -useckill -h127.0.0.1 -P"$MYSQL_PORT" "$DB_NAME" -e 'SELECT 1' >/dev/null ||
        fail mysql "user seckill cannot log in over TCP at 127.0.0.1:$MYSQL_PORT"
    ok "mariadb   $MYSQL_URL"
}

# -------------------------------------------------------------------------- data-api
# The application user's password, made once (letters and digits, as the template's
# secret: seckill migrate writes it into CREATE USER).
app_password() {
    if [[ ! -s $APP_PASSWORD_FILE ]]; then
        (umask 077 && head -c 96 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' | head -c 32 >"$APP_PASSWORD_FILE.tmp" &&
            mv "$APP_PASSWORD_FILE.tmp" "$APP_PASSWORD_FILE")
    fi
    tr -d ' \n' <"$APP_PASSWORD_FILE"
}

# data-api-local's secrets file (ARN USERNAME PASSWORD, mode 0600): the application
# user's secret. The master secret is --secret-arn, the user of MYSQL_URL.
write_data_api_secrets() {
    local pw tmp=$DATA_API_SECRETS.tmp
    pw=$(app_password)
    [[ $pw =~ ^[A-Za-z0-9]{8,128}$ ]] ||
        die "$(rel "$APP_PASSWORD_FILE") must hold 8 to 128 letters and digits (delete it to get a new one)"
    (umask 077 && printf '%s %s %s\n%s %s\n%s %s\n%s %s\n%s %s\n' "$DB_APP_SECRET_ARN" "$DB_APP_USER" "$pw" \
        "$PAYMENT_WEBHOOK_SECRET_ARN" "$(webhook_secret)" \
        "$ENTRY_TOKEN_SECRET_ARN" "$(entry_secret)" \
        "$STRIPE_SECRET_KEY_ARN" "$(stripe_key)" \
        "$STRIPE_WEBHOOK_SECRET_ARN" "$(stripe_webhook_secret)" >"$tmp")
    mv -f "$tmp" "$DATA_API_SECRETS"
}

up_data_api() {
    local bin=$BIN_DIR/data-api-local stamp
    [[ -x $bin ]] || die "$bin is missing: the workspace build did not produce it"
    write_data_api_secrets
    # A changed application password (a rotation) restarts the server with it.
    stamp="$(file_stamp "$bin") $MYSQL_URL secrets=$(cksum <"$DATA_API_SECRETS") faults=on"
    if running_ok data-api "$stamp"; then
        ok "data-api  already running (pid $(svc_pid data-api), port $DATA_API_PORT)"
    else
        check_port_free data-api
        log "starting data-api-local on 127.0.0.1:$DATA_API_PORT"
        # MYSQL_URL (with the admin password) through the environment, not the command line.
        start_bg data-api "$stamp" env RUST_LOG="${RUST_LOG:-info}" MYSQL_URL="$MYSQL_URL" "$bin" \
            --listen "127.0.0.1:$DATA_API_PORT" \
            --resource-arn "$DB_CLUSTER_ARN" \
            --secret-arn "$DB_MASTER_SECRET_ARN" \
            --secrets-file "$DATA_API_SECRETS" \
            --fault-control
        wait_port data-api 60 "data-api-local must listen on --listen (tools/data-api-local)"
    fi
    ok "data-api  $DATA_API_URL"
}

# ------------------------------------------------------------------------ migrations
migrate() {
    local bin=$BIN_DIR/seckill files want have tables log=$LOG_DIR/migrate.log
    [[ -x $bin ]] || die "$bin is missing: the workspace build did not produce the seckill CLI (tools/seckill-cli)"
    files=(migrations/*.sql)
    want=${#files[@]}
    log "applying migrations/*.sql ($want files) with target/debug/seckill migrate"
    # With the master secret; the application user's secret is read through Secrets
    # Manager (data-api-local answers GetSecretValue), exactly as in AWS.
    if ! env DATA_API_URL="$DATA_API_URL" SECRETS_MANAGER_URL="$DATA_API_URL" \
        DB_CLUSTER_ARN="$DB_CLUSTER_ARN" DB_MASTER_SECRET_ARN="$DB_MASTER_SECRET_ARN" \
        DB_APP_SECRET_ARN="$DB_APP_SECRET_ARN" DB_NAME="$DB_NAME" AWS_REGION="$AWS_REGION_LOCAL" \
        AWS_ACCESS_KEY_ID=local AWS_SECRET_ACCESS_KEY=local RUST_LOG="${RUST_LOG:-info}" \
        "$bin" migrate >"$log" 2>&1 </dev/null; then
        err "seckill migrate failed; last lines of $log:"
        tail -n 40 "$log" | sed 's/^/    | /' >&2
        show_log data-api 20
        exit 1
    fi
    sed 's/^/    | /' "$log" | tail -n 20 >&2
    # Do not trust the exit status alone: check the result in the database.
    have=$(mysql_root -N -B -e "SELECT COUNT(*) FROM \`$DB_NAME\`.schema_migrations" 2>/dev/null || echo 0)
    tables=$(mysql_root -N -B -e "SELECT COUNT(*) FROM information_schema.tables
        WHERE table_schema = '$DB_NAME' AND table_name IN ('vouchers', 'orders')" 2>/dev/null || echo 0)
    if ((have < want || tables < 2)); then
        err "seckill migrate exited 0, but the database '$DB_NAME' records $have of $want migrations in schema_migrations and has $tables of the 2 tables vouchers, orders."
        printf '%shint:%s is "seckill migrate" implemented yet (tools/seckill-cli)? Its output was:\n' "$_c_yel" "$_c_off" >&2
        sed 's/^/    | /' "$log" | tail -n 20 >&2
        exit 1
    fi
    ok "migrations: $have recorded in $DB_NAME.schema_migrations"
    # The functions' user signs in with its secret's password and reads its tables.
    MYSQL_PWD=$(app_password) mariadb --no-defaults -u"$DB_APP_USER" -h127.0.0.1 -P"$MYSQL_PORT" "$DB_NAME" \
        -e 'SELECT COUNT(*) FROM vouchers; SELECT COUNT(*) FROM orders' >/dev/null ||
        fail mysql "the application user $DB_APP_USER cannot read $DB_NAME.vouchers and orders after seckill migrate"
    ok "app user: $DB_APP_USER (only what the functions run, on $DB_NAME's tables: seckill_shared::migrate::APP_GRANTS), the functions' DB_SECRET_ARN"
}

# ---------------------------------------------------------------------------- lambda
jwt_secret() {
    if [[ ! -s $JWT_FILE ]]; then
        (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$JWT_FILE.tmp" && mv "$JWT_FILE.tmp" "$JWT_FILE")
    fi
    cat "$JWT_FILE"
}

webhook_secret() {
    if [[ ! -s $WEBHOOK_FILE ]]; then
        (umask 077 && printf 'whsec_%s' "$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')" \
            >"$WEBHOOK_FILE.tmp" && mv "$WEBHOOK_FILE.tmp" "$WEBHOOK_FILE")
    fi
    tr -d ' \n' <"$WEBHOOK_FILE"
}

# The entry-token secret (ENTRY_TOKEN_SECRET_ARN), made once like the webhook's.
entry_secret() {
    if [[ ! -s $ENTRY_FILE ]]; then
        (umask 077 && printf 'entry_%s' "$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')" \
            >"$ENTRY_FILE.tmp" && mv "$ENTRY_FILE.tmp" "$ENTRY_FILE")
    fi
    tr -d ' \n' <"$ENTRY_FILE"
}

# made_once FILE PREFIX: a secret of PREFIX and 48 hex digits, made once in FILE.
made_once() {
    if [[ ! -s $1 ]]; then
        (umask 077 && printf '%s%s' "$2" "$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')" \
            >"$1.tmp" && mv "$1.tmp" "$1")
    fi
    tr -d ' \n' <"$1"
}
stripe_key() { made_once "$STRIPE_KEY_FILE" sk_test_; }
stripe_webhook_secret() { made_once "$STRIPE_WEBHOOK_FILE" whsec_; }

# ------------------------------------------------------------------------- stripe
up_stripe() {
    local bin stamp
    bin=$(localstripe_bin)
    [[ -x $bin ]] || die "$bin is missing: scripts/setup.sh installs localstripe"
    stamp="$(file_stamp "$bin") port=$STRIPE_PORT"
    if running_ok stripe "$stamp"; then
        ok "stripe    already running (pid $(svc_pid stripe), port $STRIPE_PORT)"
    else
        check_port_free stripe
        log "starting localstripe on 127.0.0.1:$STRIPE_PORT"
        # From scratch: its save file (/tmp/localstripe.pickle) is one per machine.
        start_bg stripe "$stamp" "$bin" --port "$STRIPE_PORT" --from-scratch
        wait_port stripe 30 "localstripe must listen on --port"
    fi
    ok "stripe    $STRIPE_API_BASE (localstripe)"
}

up_events() {
    local bin stamp url
    bin=$(moto_bin)
    [[ -x $bin ]] || die "$bin is missing: scripts/setup.sh installs moto"
    stamp="$(file_stamp "$bin") port=$EVENTS_PORT"
    if running_ok events "$stamp"; then
        ok "events    already running (pid $(svc_pid events), port $EVENTS_PORT)"
    else
        check_port_free events
        log "starting moto (EventBridge, SQS) on 127.0.0.1:$EVENTS_PORT"
        start_bg events "$stamp" "$bin" -H 127.0.0.1 -p "$EVENTS_PORT"
        wait_port events 60 "moto_server must listen on -p"
    fi
    # The bus, the queue and the rule between them (made again after a restart; kept
    # as they are when they exist).
    url=$("${bin%/moto_server}/python" "$SECKILL_ROOT/scripts/events-setup.py" \
        "$EVENTS_ENDPOINT_URL" "$EVENT_BUS_NAME" "$EVENTS_QUEUE_NAME") ||
        die "making the local bus and queue failed (see above; moto's log: $(rel "$(svc_log events)"))"
    printf '%s\n' "$url" >"$EVENTS_QUEUE_FILE"
    ok "events    $EVENTS_ENDPOINT_URL (moto): bus $EVENT_BUS_NAME -> $url"
}

write_functions_env() {
    local tmp=$FUNCTIONS_ENV.tmp
    {
        echo "REDIS_URL=$REDIS_URL"
        echo "REDIS_CLUSTER=true"
        echo "DB_CLUSTER_ARN=$DB_CLUSTER_ARN"
        echo "DB_SECRET_ARN=$DB_SECRET_ARN"
        echo "DB_NAME=$DB_NAME"
        echo "DATA_API_URL=$DATA_API_URL"
        echo "AWS_REGION=$AWS_REGION_LOCAL"
        echo "AWS_DEFAULT_REGION=$AWS_REGION_LOCAL"
        echo "AWS_ACCESS_KEY_ID=local"
        echo "AWS_SECRET_ACCESS_KEY=local"
        echo "SECKILL_DEV_JWT_SECRET=$(jwt_secret)"
        # cargo lambda watch emulates Lambda (AWS_LAMBDA_FUNCTION_NAME is set), where the
        # function refuses a dev secret unless told this is a local emulator.
        echo "SECKILL_DEV_JWT_IN_LAMBDA=allow"
        # The webhook's secret through Secrets Manager, as in AWS (data-api-local's).
        echo "PAYMENT_WEBHOOK_SECRET_ARN=$PAYMENT_WEBHOOK_SECRET_ARN"
        echo "ENTRY_TOKEN_SECRET_ARN=$ENTRY_TOKEN_SECRET_ARN"
        echo "STRIPE_API_BASE=$STRIPE_API_BASE"
        echo "STRIPE_SECRET_KEY_ARN=$STRIPE_SECRET_KEY_ARN"
        echo "STRIPE_WEBHOOK_SECRET_ARN=$STRIPE_WEBHOOK_SECRET_ARN"
        echo "STRIPE_PUBLISHABLE_KEY=$STRIPE_PUBLISHABLE_KEY"
        echo "STRIPE_JS_URL=$STRIPE_JS_URL"
        # A payment started at Stripe stays payable this long past its deadline (AWS: 300 s);
        # short here, so the suites see both sides of it in seconds.
        echo "SECKILL_PAYMENT_GRACE_S=$PAYMENT_GRACE_S"
        echo "SECRETS_MANAGER_URL=$DATA_API_URL"
        echo "EVENT_BUS_NAME=$EVENT_BUS_NAME"
        echo "EVENTS_ENDPOINT_URL=$EVENTS_ENDPOINT_URL"
        echo "RUST_LOG=${SECKILL_FUNCTIONS_RUST_LOG:-info}"
        # Locally one drainer invocation drains for 2 s, not the 50 s of a one-minute
        # schedule in AWS, so an invoke (the tests', the demo's, yours) returns quickly.
        echo "DRAINER_MAX_RUN_MS=${DRAINER_MAX_RUN_MS:-2000}"
        echo "DRAINER_IDLE_POLL_MS=${DRAINER_IDLE_POLL_MS:-50}"
        # Other tuning knobs: the functions' own defaults, unless set in the environment
        # of `scripts/stack.sh up` (DRAINER_*, REDIS_TIMEOUT_MS, DATA_API_TIMEOUT_MS).
        env | grep -E '^(DRAINER_[A-Z_]+|REDIS_TIMEOUT_MS|DATA_API_TIMEOUT_MS)=' |
            grep -vE '^DRAINER_(MAX_RUN_MS|IDLE_POLL_MS)=' | sort || true
        if [[ -f $DEV_DIR/functions.extra.env ]]; then
            grep -v '^[[:space:]]*\(#\|$\)' "$DEV_DIR/functions.extra.env" || true
        fi
    } >"$tmp"
    mv -f "$tmp" "$FUNCTIONS_ENV"
}

# warm FUNCTION METHOD URL [BODY-FILE]: wait until FUNCTION answered one request.
# A first request makes the watch compile and start the function; show progress.
warm() {
    local fn=$1 method=$2 url=$3 body=${4:-} out=$DEV_DIR/warm-$1 start deadline curl_pid code
    local lambda_pid note next_note=$((SECONDS + 10)) t0=$SECONDS seen_running=0 gone_since=0
    local -a args=(-sS -o "$out.body" -w '%{http_code}' -X "$method" --max-time "$WARMUP_TIMEOUT")
    [[ -n $body ]] && args+=(-H 'content-type: application/json' --data-binary "@$body")
    lambda_pid=$(svc_pid lambda)
    deadline=$((SECONDS + WARMUP_TIMEOUT))
    start=$(wc -l <"$(svc_log lambda)")
    while :; do
        rm -f "$out.code" "$out.body"
        curl "${args[@]}" "$url" >"$out.code" 2>"$out.err" &
        curl_pid=$!
        while pid_alive "$curl_pid"; do
            sleep 0.5
            pid_alive "$lambda_pid" || fail lambda "cargo lambda watch exited while starting $fn"
            # The watch logs "Running `target/debug/<fn>`" when the instance starts; if no
            # such process is left while our request waits, the function died without
            # answering (a crash at start, or a stub main).
            if ((!seen_running)) && tail -n "+$((start + 1))" "$(svc_log lambda)" | grep -q "Running \`.*/$fn\`"; then
                seen_running=1
            fi
            if ((seen_running)); then
                if pid_descendants "$lambda_pid" | while read -r p; do pid_cmdline "$p"; echo; done | grep -q "/$fn\b"; then
                    gone_since=0
                elif ((gone_since == 0)); then
                    gone_since=$SECONDS
                elif ((SECONDS - gone_since >= 3)); then
                    kill "$curl_pid" 2>/dev/null || true
                    fail lambda "$fn started and exited without answering the first request" \
                        "see the function's output above: a configuration error (.dev/functions.env), a crash at start, or a main that does not run the Lambda runtime"
                fi
            fi
            if ((SECONDS >= next_note)); then
                note=$(tail -n "+$((start + 1))" "$(svc_log lambda)" | grep -E 'Compiling|Blocking|Running|error' | tail -n1 | sed 's/^ *//')
                log "waiting for $fn to answer ($((SECONDS - t0))s)${note:+: $note}"
                next_note=$((SECONDS + 10))
            fi
            if ((SECONDS >= deadline)); then
                kill "$curl_pid" 2>/dev/null || true
                fail lambda "$fn did not answer within ${WARMUP_TIMEOUT}s (SECKILL_WARMUP_TIMEOUT)"
            fi
        done
        wait "$curl_pid" 2>/dev/null || true
        code=$(cat "$out.code" 2>/dev/null || echo 000)
        if [[ $code == 000 || $code == 408 ]]; then
            # Connection trouble or the watch's own timeout (SECKILL_LAMBDA_TIMEOUT) while
            # compiling: try again until the deadline.
            ((SECONDS < deadline)) || fail lambda "$fn did not answer within ${WARMUP_TIMEOUT}s: $(cat "$out.err")"
            sleep 1
            continue
        fi
        if grep -q '"title":"Missing function"' "$out.body" 2>/dev/null; then
            fail lambda "cargo lambda watch does not know the function $fn: $(cat "$out.body")"
        fi
        break
    done
    if [[ $code == 5* ]]; then
        warn "$fn answered $method with HTTP $code: $(head -c 400 "$out.body" 2>/dev/null | tr '\n' ' ')"
        warn "the function runs but failed this request; see .dev/logs/lambda.log"
    else
        ok "$fn answered $method with HTTP $code after $((SECONDS - t0))s: $(head -c 160 "$out.body" 2>/dev/null | tr '\n' ' ')"
    fi
    rm -f "$out.code" "$out.body" "$out.err"
}

up_lambda() {
    local stamp args=() restart=$1 watch_dir=$SECKILL_ROOT
    command -v cargo-lambda >/dev/null 2>&1 || cargo lambda --version >/dev/null 2>&1 ||
        die "cargo-lambda not found: run scripts/setup.sh"
    write_functions_env
    # Another Redis (engine, topology) restarts the watch too: the functions' connections
    # and per-instance memory belong to the Redis they started with.
    stamp="port=$LAMBDA_PORT reload=$LAMBDA_RELOAD concurrency=$LAMBDA_CONCURRENCY timeout=$LAMBDA_TIMEOUT env=$(cksum <"$FUNCTIONS_ENV") redis=${REDIS_DATA##*/}"
    if [[ $LAMBDA_RELOAD != 1 ]]; then
        # Without reload the instances keep running the code they started with: restart
        # the watch when the function binaries changed.
        stamp="$stamp $(file_stamp "$BIN_DIR/seckill-http" "$BIN_DIR/order-drainer" | tr '\n' ' ')"
        args+=(--ignore-changes)
        # The watch puts an inotify watch on every directory below its working directory
        # even with --ignore-changes (twice: 5,000 and more here, target/ and .dev/
        # included), and its watcher thread then wakes on every write MariaDB, Redis and
        # the logs make under .dev/: up to a fifth of a CPU while a benchmark drains.
        # Without reload it has nothing to watch: it runs from an empty directory, the
        # workspace named by --manifest-path.
        watch_dir=$DEV_DIR/lambda-cwd
        mkdir -p "$watch_dir"
        args+=(--manifest-path "$SECKILL_ROOT/Cargo.toml")
    fi
    stamp="$stamp cwd=$watch_dir"
    [[ -n $LAMBDA_TIMEOUT ]] && args+=(--timeout "$LAMBDA_TIMEOUT")
    if ((restart)) && [[ -n $(svc_pid lambda) ]]; then
        log "restarting cargo lambda watch (--restart-functions)"
        stop_service lambda
    fi
    if running_ok lambda "$stamp"; then
        ok "lambda    already running (pid $(svc_pid lambda), port $LAMBDA_PORT)"
    else
        check_port_free lambda
        log "starting cargo lambda watch on 127.0.0.1:$LAMBDA_PORT"
        start_bg lambda "$stamp" env -C "$watch_dir" cargo lambda watch \
            --invoke-address 127.0.0.1 --invoke-port "$LAMBDA_PORT" \
            --env-file "$FUNCTIONS_ENV" --concurrency "$LAMBDA_CONCURRENCY" "${args[@]}"
        wait_port lambda 60
    fi
    warm seckill-http GET "$LAMBDA_URL/vouchers/1"
    warm order-drainer POST "$INVOKE_URL" "$EVENT_FIXTURE"
}

# ------------------------------------------------------------------------- gateway
# The template's default of parameter $1 (a Number).
template_default() {
    awk -v p="  $1:" '$0 == p { found = 1; next } found && /^    Default:/ { print $2; exit }' \
        "$SECKILL_ROOT/template.yaml"
}

up_gateway() {
    local bin=$BIN_DIR/api-gateway-local stamp code webhook_throttle edge_limit
    [[ -x $bin ]] || die "$bin is missing: the workspace build did not produce it"
    # The payment webhooks' route throttling, as the template's defaults set it in AWS.
    webhook_throttle="$(template_default WebhookRateLimit),$(template_default WebhookBurstLimit)"
    [[ $webhook_throttle =~ ^[0-9]+,[0-9]+$ ]] ||
        die "template.yaml's WebhookRateLimit/WebhookBurstLimit defaults not found ($webhook_throttle)"
    # The edge's per-client limit on the anonymous reads (the web ACL's rate-based rule,
    # EdgeReadsPerClientMinute a minute): a bucket of that many, refilled evenly.
    edge_limit=$(template_default EdgeReadsPerClientMinute)
    [[ $edge_limit =~ ^[0-9]+$ ]] || die "template.yaml's EdgeReadsPerClientMinute default not found"
    edge_limit="$(((edge_limit + 59) / 60)),$edge_limit"
    # A restarted watch restarts the gateway too: no pooled connection to the old one.
    stamp="$(file_stamp "$bin") lambda=$LAMBDA_PORT pid=$(svc_pid lambda) throttle=$webhook_throttle edge=$edge_limit"
    if running_ok gateway "$stamp"; then
        ok "gateway   already running (pid $(svc_pid gateway), port $GATEWAY_PORT)"
    else
        check_port_free gateway
        log "starting api-gateway-local on 127.0.0.1:$GATEWAY_PORT"
        start_bg gateway "$stamp" env RUST_LOG="${RUST_LOG:-warn}" "$bin" \
            --listen "127.0.0.1:$GATEWAY_PORT" \
            --lambda "http://127.0.0.1:$LAMBDA_PORT" --function seckill-http \
            --route-throttle "POST /payments/webhook=$webhook_throttle" \
            --route-throttle "POST /payments/stripe=$webhook_throttle" \
            --client-limit "GET /vouchers/{id}+GET /app/{file}=$edge_limit"
        wait_port gateway 30 "api-gateway-local must listen on --listen (tools/api-gateway-local)"
    fi
    code=$(curl -sS -o /dev/null -w '%{http_code}' --max-time 60 "$HTTP_URL/vouchers/1" 2>&1 || true)
    [[ $code == [24]?? ]] || fail gateway "seckill-http through the gateway answered GET /vouchers/1 with '$code'"
    ok "gateway   $HTTP_URL (seckill-http as API Gateway invokes it)"
}

write_stack_env() {
    local tmp=$STACK_ENV.tmp
    cat >"$tmp" <<EOF
SECKILL_HTTP_URL=$HTTP_URL
SECKILL_LAMBDA_URL=$LAMBDA_URL
DRAINER_INVOKE_URL=$INVOKE_URL
REDIS_URL=$REDIS_URL
MYSQL_URL=$MYSQL_URL
DATA_API_URL=$DATA_API_URL
SECKILL_DEV_JWT_SECRET=$(jwt_secret)
REDIS_CLUSTER=true
DB_CLUSTER_ARN=$DB_CLUSTER_ARN
DB_SECRET_ARN=$DB_SECRET_ARN
DB_MASTER_SECRET_ARN=$DB_MASTER_SECRET_ARN
DB_APP_SECRET_ARN=$DB_APP_SECRET_ARN
SECRETS_MANAGER_URL=$DATA_API_URL
PAYMENT_WEBHOOK_SECRET_ARN=$PAYMENT_WEBHOOK_SECRET_ARN
SECKILL_PAYMENT_WEBHOOK_SECRET=$(webhook_secret)
ENTRY_TOKEN_SECRET_ARN=$ENTRY_TOKEN_SECRET_ARN
SECKILL_ENTRY_TOKEN_SECRET=$(entry_secret)
STRIPE_API_BASE=$STRIPE_API_BASE
STRIPE_SECRET_KEY=$(stripe_key)
STRIPE_WEBHOOK_SECRET=$(stripe_webhook_secret)
STRIPE_PUBLISHABLE_KEY=$STRIPE_PUBLISHABLE_KEY
STRIPE_JS_URL=$STRIPE_JS_URL
SECKILL_PAYMENT_GRACE_S=$PAYMENT_GRACE_S
EVENTS_ENDPOINT_URL=$EVENTS_ENDPOINT_URL
EVENT_BUS_NAME=$EVENT_BUS_NAME
EVENTS_QUEUE_URL=$(cat "$EVENTS_QUEUE_FILE")
SECKILL_EDGE_READS_PER_CLIENT_MINUTE=$(template_default EdgeReadsPerClientMinute)
DB_NAME=$DB_NAME
AWS_REGION=$AWS_REGION_LOCAL
AWS_ACCESS_KEY_ID=local
AWS_SECRET_ACCESS_KEY=local
SECKILL_REDIS_ENGINE=$REDIS_ENGINE
SECKILL_REDIS_TOPOLOGY=$REDIS_TOPOLOGY
SECKILL_REDIS_SERVER=$REDIS_SERVER
REDIS_NODES=$(redis_nodes_csv)
EOF
    mv -f "$tmp" "$STACK_ENV"
}

# ------------------------------------------------------------------------- commands
lock_stack() {
    mkdir -p "$DEV_DIR"
    if command -v flock >/dev/null 2>&1; then
        exec 9>"$DEV_DIR/stack.lock"
        if ! flock -n 9; then
            log "another scripts/stack.sh is running; waiting for it"
            flock 9
        fi
    fi
}

cmd_up() {
    local restart=0 t0 a
    for a in "$@"; do
        case $a in
        --restart-functions) restart=1 ;;
        *) die "unknown option for up: $a" ;;
        esac
    done
    t0=$(now_s)
    # .dev holds the local secrets (the dev JWT secret, passwords in URLs): readable by
    # this user alone, whatever the caller's umask; files made earlier are narrowed too.
    umask 077
    mkdir -p "$DEV_DIR" "$PID_DIR" "$LOG_DIR"
    chmod -R go-rwx "$DEV_DIR"
    [[ -f $EVENT_FIXTURE ]] || die "missing $EVENT_FIXTURE"
    "$SECKILL_ROOT/scripts/setup.sh"
    lock_stack
    if [[ -n $ADOPTED_REDIS ]]; then
        log "Redis keeps the topology it runs with: $ADOPTED_REDIS (SECKILL_REDIS_ENGINE, SECKILL_REDIS_TOPOLOGY or SECKILL_VALKEY_VERSION switch it; SECKILL_REDIS_TOPOLOGY=single scripts/stack.sh up for the default)"
    fi
    # A stale contract file must not point anyone at a stack that is being (re)started.
    rm -f "$STACK_ENV"
    log "cargo build --workspace --bins"
    cargo build --workspace --bins ||
        die "cargo build --workspace --bins failed (see above); fix the build and run scripts/stack.sh up again"
    # cargo lambda watch starts a function with `cargo run --bin <fn>`, which resolves
    # features for that one package: a different build of some dependencies than the
    # workspace build above. Build exactly that now, so the watch starts the functions
    # without compiling and the binaries' stamps stay stable between runs.
    for fn in seckill-http order-drainer; do
        log "cargo build --bin $fn (the build cargo lambda watch runs)"
        cargo build --bin "$fn" ||
            die "cargo build --bin $fn failed (see above); fix the build and run scripts/stack.sh up again"
    done
    up_redis
    up_mysql
    up_data_api
    migrate
    up_stripe
    up_events
    up_lambda "$restart"
    up_gateway
    write_stack_env
    ok "stack up in $(elapsed_since "$t0"); contract file: .dev/stack.env"
    cmd_status
}

cmd_down() {
    local purge=0 a s
    for a in "$@"; do
        case $a in
        --purge) purge=1 ;;
        *) die "unknown option for down: $a" ;;
        esac
    done
    [[ -d $DEV_DIR ]] || { ok "stack is down (no .dev/)"; return 0; }
    lock_stack
    rm -f "$STACK_ENV"
    for s in gateway lambda data-api mysql stripe events; do stop_service "$s"; done
    # Every Redis node with a pid file, also of a topology no longer selected.
    stop_redis_all
    rm -f "$MYSQL_SOCK" "$MYSQL_SOCK.lock"
    if ((purge)); then
        log "deleting $DEV_DIR"
        rm -rf "${DEV_DIR:?}"
    fi
    ok "stack is down"
}

# The role of the Redis node on port $1: "primary slots 0-5460", "replica of
# 127.0.0.1:26400 (connected)", or nothing when it does not answer.
redis_role_note() {
    local port=$1 role=() slots
    mapfile -t role < <(node_cli "$port" role 2>/dev/null | tr -d '\r')
    case ${role[0]:-} in
    master)
        slots=$(node_cli "$port" cluster nodes 2>/dev/null | tr -d '\r' |
            awk '$3 ~ /myself/ { for (i = 9; i <= NF; i++) printf "%s%s", (i > 9 ? "," : ""), $i }')
        echo "primary${slots:+ slots $slots}"
        ;;
    slave) echo "replica of ${role[1]:-?}:${role[2]:-?} (${role[3]:-?})" ;;
    esac
}

cmd_status() {
    local s pid port state listening note names=() stamp='' current=''
    # The Redis nodes that run (whatever topology started them), else the selected ones.
    for s in $(redis_services_on_record); do
        [[ -n $(svc_pid "$s") ]] && names+=("$s")
    done
    ((${#names[@]})) || mapfile -t names < <(redis_services)
    for s in "${names[@]}" mysql data-api stripe events lambda gateway; do
        pid=$(svc_pid "$s")
        port=$(cat "$PID_DIR/$s.port" 2>/dev/null || svc_port "$s")
        note=''
        if [[ -n $pid ]]; then
            state=up
            port_open "$port" && listening=listening || listening="not listening"
            if [[ $s == redis* ]]; then
                note=$(redis_role_note "$port")
                [[ -z $stamp ]] && stamp=$(cat "$PID_DIR/$s.stamp" 2>/dev/null || true)
            fi
        else
            state=down listening=""
            port_open "$port" && listening="port in use by another process"
        fi
        printf '%-9s %-4s pid=%-8s port=%-6s %s%s\n' "$s" "$state" "${pid:--}" "$port" "$listening" "${note:+  $note}"
    done
    if [[ -n $stamp ]]; then
        current=$(describe_redis_stamp "$stamp")
        echo "redis: $current, data in $(rel "$(sed -n 's/.*data=\([^ ]*\).*/\1/p' <<<"$stamp")")"
        if [[ $current != "$REDIS_ENGINE "* || $current != *", $REDIS_TOPOLOGY topology" ]]; then
            echo "redis: SECKILL_REDIS_ENGINE=$REDIS_ENGINE SECKILL_REDIS_TOPOLOGY=$REDIS_TOPOLOGY select another one: the next \`scripts/stack.sh up\` switches to it"
        fi
    else
        echo "redis: selected $REDIS_ENGINE, $REDIS_TOPOLOGY topology (not running)"
    fi
    if [[ -f $STACK_ENV ]]; then echo "stack.env present: $STACK_ENV"; else echo "stack.env absent"; fi
}

case ${1:-} in
up) shift && cmd_up "$@" ;;
down) shift && cmd_down "$@" ;;
status) shift && cmd_status ;;
*)
    echo "usage: $0 up [--restart-functions] | down [--purge] | status" >&2
    exit 2
    ;;
esac
