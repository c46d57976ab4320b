#!/usr/bin/env bash
# The local stack: Redis (cluster mode), MariaDB, the local Data API server and
# `cargo lambda watch` serving seckill-http and order-drainer.
#
#   scripts/stack.sh up [--restart-functions]   start what is not running, write .dev/stack.env
#   scripts/stack.sh down [--purge]             stop everything (--purge: delete .dev/ too)
#   scripts/stack.sh status                     one line per service
#
# All state lives under .dev/ (git-ignored): data in .dev/redis and .dev/mysql, pids in
# .dev/pids, logs in .dev/logs, the function environment in .dev/functions.env and the
# contract file .dev/stack.env (written last, once everything answers; see
# README.md, "The local stack").
#
# Ports (override with these variables): Redis SECKILL_REDIS_PORT (16379; its cluster bus
# uses that port + 10000, so 26379, which must be free too), MariaDB
# SECKILL_MYSQL_PORT (13306), Data API SECKILL_DATA_API_PORT (18080), cargo lambda watch
# SECKILL_LAMBDA_PORT (19000).
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
# Function environment (.dev/functions.env): the stack's addresses, plus DRAINER_*,
# REDIS_TIMEOUT_MS and DATA_API_TIMEOUT_MS when set in the environment of `up`, plus the
# KEY=VALUE lines of .dev/functions.extra.env if that file exists. A change restarts the
# watch on the next `up`.
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ensure_path
cd "$SECKILL_ROOT"

REDIS_PORT=${SECKILL_REDIS_PORT:-16379}
MYSQL_PORT=${SECKILL_MYSQL_PORT:-13306}
DATA_API_PORT=${SECKILL_DATA_API_PORT:-18080}
LAMBDA_PORT=${SECKILL_LAMBDA_PORT:-19000}
LAMBDA_RELOAD=${SECKILL_LAMBDA_RELOAD:-0}
LAMBDA_CONCURRENCY=${SECKILL_LAMBDA_CONCURRENCY:-1}
LAMBDA_TIMEOUT=${SECKILL_LAMBDA_TIMEOUT:-}
WARMUP_TIMEOUT=${SECKILL_WARMUP_TIMEOUT:-900}

DB_CLUSTER_ARN=arn:aws:rds:us-east-1:000000000000:cluster:seckill-local
DB_SECRET_ARN=arn:aws:secretsmanager:us-east-1:000000000000:secret:seckill-local
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
EVENT_FIXTURE=$SECKILL_ROOT/tests/fixtures/eventbridge-scheduled.json

BIN_DIR=${CARGO_TARGET_DIR:-$SECKILL_ROOT/target}/debug
HTTP_URL=http://127.0.0.1:$LAMBDA_PORT/lambda-url/seckill-http
INVOKE_URL=http://127.0.0.1:$LAMBDA_PORT/2015-03-31/functions/order-drainer/invocations
REDIS_URL=redis://127.0.0.1:$REDIS_PORT
MYSQL_URL=mysql://seckill:seckill@127.0.0.1:$MYSQL_PORT/$DB_NAME
DATA_API_URL=http://127.0.0.1:$DATA_API_PORT

SERVICES=(redis mysql data-api lambda)

# Unix sockets paths are limited to ~107 bytes; fall back to /tmp for deep checkouts.
MYSQL_SOCK=$MYSQL_DIR/mysqld.sock
if ((${#MYSQL_SOCK} > 100)); then
    MYSQL_SOCK=/tmp/seckill-mysqld-$(printf '%s' "$SECKILL_ROOT" | cksum | cut -d' ' -f1).sock
fi
MYSQL_ADMIN_USER=$(id -un)

svc_port() {
    case $1 in
    redis) echo "$REDIS_PORT" ;;
    mysql) echo "$MYSQL_PORT" ;;
    data-api) echo "$DATA_API_PORT" ;;
    lambda) echo "$LAMBDA_PORT" ;;
    esac
}
svc_port_var() {
    case $1 in
    redis) echo SECKILL_REDIS_PORT ;;
    mysql) echo SECKILL_MYSQL_PORT ;;
    data-api) echo SECKILL_DATA_API_PORT ;;
    lambda) echo SECKILL_LAMBDA_PORT ;;
    esac
}
# A word the process's command line must contain for a pid file to be believed.
svc_signature() {
    case $1 in
    redis) echo redis-server ;;
    mysql) echo mariadbd ;;
    data-api) echo data-api-local ;;
    lambda) echo cargo-lambda ;;
    esac
}
svc_log() { echo "$LOG_DIR/$1.log"; }

# The pid of our running service $1, or nothing.
svc_pid() {
    local f=$PID_DIR/$1.pid pid sig cmd
    [[ -r $f ]] || return 0
    pid=$(<"$f")
    pid_alive "$pid" || return 0
    sig=$(svc_signature "$1")
    cmd=$(pid_cmdline "$pid")
    # mariadbd may be installed as mysqld.
    if [[ $cmd == *"$sig"* || ($1 == mysql && $cmd == *mysqld*) ]]; then
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

# Refuse to start service $1 when something else already listens on its port (for Redis
# also on its cluster bus port, the port + 10000).
check_port_free() {
    local port var owner p
    port=$(svc_port "$1")
    var=$(svc_port_var "$1")
    for p in "$port" $([[ $1 == redis ]] && echo $((port + 10000))); do
        if port_open "$p"; then
            owner=$(port_owner "$p")
            [[ $p != "$port" ]] && p="$p (the Redis cluster bus port, $var + 10000)"
            die "port $p (for $1) is already in use${owner:+ by $owner}, not by this stack.
Stop that process, or pick another port: $var=<free port> scripts/stack.sh up"
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
redis_cli() { redis-cli -h 127.0.0.1 -p "$REDIS_PORT" "$@"; }

up_redis() {
    local stamp info assigned deadline
    stamp="redis-server $(redis-server --version | cut -d' ' -f3)"
    mkdir -p "$REDIS_DIR"
    if running_ok redis "$stamp"; then
        ok "redis already running (pid $(svc_pid redis), port $REDIS_PORT)"
    else
        check_port_free redis
        log "starting redis-server on 127.0.0.1:$REDIS_PORT (cluster mode, AOF, data in .dev/redis)"
        start_bg redis "$stamp" redis-server \
            --bind 127.0.0.1 --port "$REDIS_PORT" --protected-mode yes \
            --daemonize no --logfile '' --dir "$REDIS_DIR" \
            --appendonly yes --save '' \
            --cluster-enabled yes --cluster-config-file nodes.conf \
            --cluster-announce-ip 127.0.0.1 --cluster-node-timeout 5000 \
            --cluster-require-full-coverage yes
        deadline=$((SECONDS + 30))
        until [[ "$(redis_cli ping 2>/dev/null)" == PONG ]]; do
            pid_alive "$(<"$PID_DIR/redis.pid")" || fail redis "redis-server exited during startup"
            ((SECONDS < deadline)) || fail redis "redis-server did not answer PING within 30s"
            sleep 0.2
        done
    fi
    info=$(redis_cli cluster info) || fail redis "CLUSTER INFO failed"
    assigned=$(sed -n 's/^cluster_slots_assigned:\([0-9]*\).*/\1/p' <<<"$info")
    if [[ $assigned == 0 ]]; then
        log "assigning all 16384 slots to the single cluster node"
        [[ "$(redis_cli cluster addslotsrange 0 16383)" == OK ]] ||
            fail redis "CLUSTER ADDSLOTSRANGE 0 16383 failed"
    elif [[ $assigned != 16384 ]]; then
        fail redis "the Redis node owns $assigned of 16384 slots (.dev/redis/nodes.conf)" \
            "reset the local data: scripts/stack.sh down --purge && scripts/stack.sh up"
    fi
    deadline=$((SECONDS + 30))
    until redis_cli cluster info 2>/dev/null | grep -q '^cluster_state:ok'; do
        ((SECONDS < deadline)) || fail redis "Redis cluster_state is not ok after 30s: $(redis_cli cluster info | tr -d '\r' | head -n1)"
        sleep 0.2
    done
    ok "redis     127.0.0.1:$REDIS_PORT cluster_state:ok"
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
GRANT ALL PRIVILEGES ON \`seckill%\`.* TO 'seckill'@'localhost';
GRANT ALL PRIVILEGES ON \`seckill%\`.* TO 'seckill'@'127.0.0.1';
GRANT ALL PRIVILEGES ON \`seckill%\`.* TO 'seckill'@'%';
DROP USER IF EXISTS ''@'localhost';
FLUSH PRIVILEGES;
SQL
    # The password through the environment, never on a command line (`ps` shows those).
    MYSQL_PWD=seckill mariadb --no-defaults -useckill -h127.0.0.1 -P"$MYSQL_PORT" "$DB_NAME" -e 'SELECT 1' >/dev/null ||
        fail mysql "user seckill cannot log in over TCP at 127.0.0.1:$MYSQL_PORT"
    ok "mariadb   $MYSQL_URL"
}

# -------------------------------------------------------------------------- data-api
up_data_api() {
    local bin=$BIN_DIR/data-api-local stamp
    [[ -x $bin ]] || die "$bin is missing: the workspace build did not produce it"
    stamp="$(file_stamp "$bin") $MYSQL_URL"
    if running_ok data-api "$stamp"; then
        ok "data-api  already running (pid $(svc_pid data-api), port $DATA_API_PORT)"
    else
        check_port_free data-api
        log "starting data-api-local on 127.0.0.1:$DATA_API_PORT"
        start_bg data-api "$stamp" env RUST_LOG="${RUST_LOG:-info}" "$bin" \
            --listen "127.0.0.1:$DATA_API_PORT" \
            --mysql-url "$MYSQL_URL" \
            --resource-arn "$DB_CLUSTER_ARN" \
            --secret-arn "$DB_SECRET_ARN"
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
    if ! env DATA_API_URL="$DATA_API_URL" DB_CLUSTER_ARN="$DB_CLUSTER_ARN" \
        DB_SECRET_ARN="$DB_SECRET_ARN" DB_NAME="$DB_NAME" AWS_REGION="$AWS_REGION_LOCAL" \
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
}

# ---------------------------------------------------------------------------- lambda
jwt_secret() {
    if [[ ! -s $JWT_FILE ]]; then
        (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$JWT_FILE.tmp" && mv "$JWT_FILE.tmp" "$JWT_FILE")
    fi
    cat "$JWT_FILE"
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
    local stamp args=() restart=$1
    command -v cargo-lambda >/dev/null 2>&1 || cargo lambda --version >/dev/null 2>&1 ||
        die "cargo-lambda not found: run scripts/setup.sh"
    write_functions_env
    stamp="port=$LAMBDA_PORT reload=$LAMBDA_RELOAD concurrency=$LAMBDA_CONCURRENCY timeout=$LAMBDA_TIMEOUT env=$(cksum <"$FUNCTIONS_ENV")"
    if [[ $LAMBDA_RELOAD != 1 ]]; then
        # Without reload the instances keep running the code they started with: restart
        # the watch when the function binaries changed.
        stamp="$stamp $(file_stamp "$BIN_DIR/seckill-http" "$BIN_DIR/order-drainer" | tr '\n' ' ')"
        args+=(--ignore-changes)
    fi
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
        start_bg lambda "$stamp" cargo lambda watch \
            --invoke-address 127.0.0.1 --invoke-port "$LAMBDA_PORT" \
            --env-file "$FUNCTIONS_ENV" --concurrency "$LAMBDA_CONCURRENCY" "${args[@]}"
        wait_port lambda 60
    fi
    warm seckill-http GET "$HTTP_URL/vouchers/1"
    warm order-drainer POST "$INVOKE_URL" "$EVENT_FIXTURE"
}

write_stack_env() {
    local tmp=$STACK_ENV.tmp
    cat >"$tmp" <<EOF
SECKILL_HTTP_URL=$HTTP_URL
DRAINER_INVOKE_URL=$INVOKE_URL
REDIS_URL=$REDIS_URL
MYSQL_URL=$MYSQL_URL
DATA_API_URL=$DATA_API_URL
SECKILL_DEV_JWT_SECRET=$(jwt_secret)
REDIS_CLUSTER=true
DB_CLUSTER_ARN=$DB_CLUSTER_ARN
DB_SECRET_ARN=$DB_SECRET_ARN
DB_NAME=$DB_NAME
AWS_REGION=$AWS_REGION_LOCAL
AWS_ACCESS_KEY_ID=local
AWS_SECRET_ACCESS_KEY=local
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
    up_lambda "$restart"
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
    for s in lambda data-api mysql redis; do stop_service "$s"; done
    rm -f "$MYSQL_SOCK" "$MYSQL_SOCK.lock"
    if ((purge)); then
        log "deleting $DEV_DIR"
        rm -rf "${DEV_DIR:?}"
    fi
    ok "stack is down"
}

cmd_status() {
    local s pid port state listening
    for s in "${SERVICES[@]}"; do
        pid=$(svc_pid "$s")
        port=$(cat "$PID_DIR/$s.port" 2>/dev/null || svc_port "$s")
        if [[ -n $pid ]]; then
            state=up
            port_open "$port" && listening=listening || listening="not listening"
        else
            state=down listening=""
            port_open "$port" && listening="port in use by another process"
        fi
        printf '%-9s %-4s pid=%-8s port=%-6s %s\n' "$s" "$state" "${pid:--}" "$port" "$listening"
    done
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
