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
    cargo build --quiet --bin seckill --bin seckill-load
    target/debug/seckill demo --stock "${DEMO_STOCK:-100}" --buyers "${DEMO_BUYERS:-400}"
}

# The pages: a new sale opening in two minutes, the buyer page for two buyers and the
# operators' live view, as URLs to open in a browser (tokens in the URL's fragment).
step_pages() {
    local admin begins ends body id
    export SECKILL_DEV_JWT_SECRET
    admin=$(target/debug/seckill token --sub demo-operator --admin --ttl 86400)
    begins=$(date -u -d '+2 minutes' +%Y-%m-%dT%H:%M:%SZ)
    ends=$(date -u -d '+1 hour' +%Y-%m-%dT%H:%M:%SZ)
    body=$(curl -fsS -X POST -H "authorization: Bearer $admin" -H 'content-type: application/json' \
        --data "{\"title\":\"Demo voucher\",\"stock\":10,\"begins_at\":\"$begins\",\"ends_at\":\"$ends\"}" \
        "$SECKILL_HTTP_URL/vouchers")
    id=$(sed -E 's/.*"id":"([0-9]+)".*/\1/' <<<"$body")
    PAGE_ALICE="$SECKILL_HTTP_URL/app/sale.html?voucher=$id#token=$(target/debug/seckill token --sub alice --ttl 86400)"
    PAGE_BOB="$SECKILL_HTTP_URL/app/sale.html?voucher=$id#token=$(target/debug/seckill token --sub bob --ttl 86400)"
    PAGE_OPS="$SECKILL_HTTP_URL/app/ops.html?voucher=$id#token=$admin"
    DEMO_PAGE_VOUCHER=$id
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

Watch a sale in a browser (voucher $DEMO_PAGE_VOUCHER opens two minutes after the demo):

  buyer alice     $PAGE_ALICE
  buyer bob       $PAGE_BOB
  live view       $PAGE_OPS

  # a crowd of 500 buyers over HTTP while you watch (the live view moves)
  target/debug/seckill-load rush $DEMO_PAGE_VOUCHER --buyers 500 --rate 50

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
step_pages
step_explain
