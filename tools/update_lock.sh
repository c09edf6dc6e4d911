#!/usr/bin/env bash
# Re-locks the Python dependencies (docs/dependencies.md): resolves the newest versions the package
# index serves for pyproject.toml's dependencies and the extras the bootstrap installs, installs
# them into a clean venv with tools/bootstrap.sh (LOCK=none), writes tools/lock/x86_64.txt from
# that install and tools/lock/jetson-aarch64.txt from the same requirements resolved for JetPack 6
# (tools/lock_jetson.py), then runs the whole suite in that venv. Commit the lock files only when
# the suite passed; the script says which.
#
#   tools/update_lock.sh [--keep-venv]     (x86_64 machine, as root for the bootstrap's apt step)
set -euo pipefail
cd "$(dirname "$0")/.."
keep=0
[ "${1:-}" = --keep-venv ] && keep=1
[ "$(uname -m)" = x86_64 ] || { echo "update_lock: run it on an x86_64 machine" >&2; exit 2; }
venv=$(mktemp -d /tmp/edge-runtime-lock.XXXXXX)/venv
[ $keep = 1 ] || trap 'rm -rf "$(dirname "$venv")"' EXIT
echo "update_lock: installing the newest versions into $venv"
VENV=$venv LOCK=none tools/bootstrap.sh
mkdir -p tools/lock
x86=tools/lock/x86_64.txt
{
    echo "# x86_64 (CPU; Python $("$venv/bin/python" -c 'import platform; print(platform.python_version())')):" \
         "what tools/bootstrap.sh installs, made by tools/update_lock.sh"
    echo "# (pip freeze of a clean install; torch is the CPU build, installed first as torch==2.13.0)"
    # torch's local label (+cpu) names the build, not a version a constraint could ask the index for
    "$venv/bin/python" -m pip freeze --all --exclude-editable | grep -v '^edge-runtime' \
        | sed -e 's/^torch==\([^+]*\)+cpu$/torch==\1/' | LC_ALL=C sort -f
} > "$x86"
echo "update_lock: $(grep -vc '^#' "$x86") packages -> $x86"
"$venv/bin/python" tools/lock_jetson.py --x86-lock "$x86" --out tools/lock/jetson-aarch64.txt
echo "update_lock: running the suite with these versions"
if "$venv/bin/pytest" -q; then
    echo "update_lock: the suite passed: commit tools/lock/"
else
    echo "update_lock: the suite FAILED with these versions: fix it, or take the old lock back" \
         "(git checkout tools/lock)" >&2
    exit 1
fi
