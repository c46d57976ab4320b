#!/usr/bin/env bash
# Offline checks of the deployment, no AWS account needed:
#
#   1. cfn-lint on template.yaml: no errors (warnings are printed, not fatal);
#   2. tests/tests/it/template.rs: routes = seckill-http's ROUTES, the JWT authorizer on the
#      protected ones, drainer timing (min-idle > timeout > max run, one run at a time,
#      an alarm), every IAM statement scoped to the configured cluster and secret, each
#      function's Config loading from exactly the template's environment;
#   3. the env_vars unit tests of both functions (the names the template may set);
#   4. `sam validate --lint`, when the SAM CLI is installed (it runs offline).
#
# `cargo test --workspace` (scripts/test.sh, CI) runs 1-3 too; this script is the quick
# way to run just them after editing template.yaml.
#
#   scripts/deploy-check.sh
#
# Needs cfn-lint: python3 -m pip install cfn-lint
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ensure_path
cd "$SECKILL_ROOT"

failed=()

cfn_lint() {
    if command -v cfn-lint >/dev/null 2>&1; then
        cfn-lint "$@"
    elif python3 -c 'import cfnlint' >/dev/null 2>&1; then
        python3 -c "import sys; from cfnlint.runner import main; sys.argv[0] = 'cfn-lint'; sys.exit(main())" "$@"
    else
        err "cfn-lint is not installed: python3 -m pip install cfn-lint"
        return 1
    fi
}

log "cfn-lint template.yaml"
set +e
cfn_lint -- template.yaml
rc=$?
set -e
# Exit code bits: 2 errors, 4 warnings, 8 informational; 1 a fatal problem.
if ((rc & 3)); then
    err "cfn-lint found errors (exit $rc)"
    failed+=(cfn-lint)
elif ((rc)); then
    warn "cfn-lint: warnings only (exit $rc)"
else
    ok "cfn-lint: clean"
fi

log "template tests and env_vars unit tests"
if cargo test -q -p seckill-tests --test it -- template:: &&
    cargo test -q -p seckill-http -p order-drainer --lib env_vars; then
    ok "template tests"
else
    failed+=("template tests")
fi

if command -v sam >/dev/null 2>&1; then
    log "sam validate --lint"
    if SAM_CLI_TELEMETRY=0 AWS_DEFAULT_REGION="${AWS_DEFAULT_REGION:-${AWS_REGION:-us-east-1}}" \
        sam validate --lint --template-file template.yaml; then
        ok "sam validate"
    else
        failed+=("sam validate")
    fi
else
    log "sam not installed: skipping sam validate (pip install aws-sam-cli)"
fi

if ((${#failed[@]})); then
    die "deployment checks failed: ${failed[*]}"
fi
ok "deployment checks passed"
