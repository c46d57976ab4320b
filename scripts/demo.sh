#!/usr/bin/env bash
# The demo: brings the local stack up, runs a small flash sale over HTTP (seckill demo:
# a voucher, a rush of buyers, the drainer, the invariants checked), and shows how to
# talk to the stack.
#
#   scripts/demo.sh          start (or reuse) the stack, run the sale, print how to call it
#   scripts/stack.sh down    stop it again
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ensure_path
cd "$SECKILL_ROOT"

step_stack_up() {
    scripts/stack.sh up
    load_env_file "$DEV_DIR/stack.env"
}

# The sale itself: a voucher, a rush of buyers over HTTP, the drainer, the invariants.
# DEMO_STOCK / DEMO_BUYERS change its size.
step_sale() {
    cargo build --quiet --bin seckill
    target/debug/seckill demo --stock "${DEMO_STOCK:-100}" --buyers "${DEMO_BUYERS:-400}"
}

step_explain() {
    local redis_port=${REDIS_URL##*:} mysql_port=${MYSQL_URL##*:}
    mysql_port=${mysql_port%%/*}
    cat <<EOF

The local stack is up. Its addresses are in .dev/stack.env:

  seckill-http (API Gateway)    $SECKILL_HTTP_URL
  order-drainer (invoke URL)    $DRAINER_INVOKE_URL
  Redis (cluster mode)          $REDIS_URL
  MariaDB                       $MYSQL_URL
  Data API                      $DATA_API_URL

Try it:

  # anyone: read a voucher (404 {"code":"not_found",...} until one exists)
  curl -s $SECKILL_HTTP_URL/vouchers/1

  # run the drainer once, as the EventBridge schedule would
  curl -s -X POST -H 'content-type: application/json' \\
       --data-binary @tests/fixtures/eventbridge-scheduled.json $DRAINER_INVOKE_URL

  # look at the data
  redis-cli -p $redis_port -c --scan --pattern 'seckill:*'
  mariadb -h127.0.0.1 -P$mysql_port -useckill -pseckill seckill -e 'SELECT * FROM vouchers'

  # pay an order as the payment provider does (a signed webhook event; --replay sends
  # it twice, --late waits for the order's deadline first)
  target/debug/seckill pay ORDER_ID

Protected routes need 'Authorization: Bearer <HS256 JWT>' signed with
SECKILL_DEV_JWT_SECRET from .dev/stack.env (sub = user id; scope 'seckill/admin' for
POST /vouchers).

Logs: .dev/logs/*.log    Status: scripts/stack.sh status    Stop: scripts/stack.sh down
EOF
}

step_stack_up
step_sale
step_explain
