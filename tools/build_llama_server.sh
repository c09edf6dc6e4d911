#!/bin/bash
# Build llama.cpp's `llama-server` as a benchmark peer, from the llama.cpp copy vendored inside PyPI's
# llama-cpp-python source package, OUTSIDE the repository. Only the server target is built, at the
# lowest CPU priority with two jobs, so that it does not steal the cores of whatever else runs.
#
#   tools/build_llama_server.sh [PEER_DIR] [LLAMA_CPP_PYTHON_VERSION]
#
# LLAMA_TARGETS (default llama-server) names other targets too: `LLAMA_TARGETS="llama-server
# llama-quantize"` also builds the quantizer tests/test_gguf_mixes.py makes its K / IQ4 files with
# (it finds PEER_DIR/build/bin/llama-quantize under /work/peers*, or $EDGE_RUNTIME_LLAMA_QUANTIZE).
#
# PEER_DIR defaults to /work/peers/llama.cpp; the binary ends up at PEER_DIR/build/bin/llama-server.
# The version defaults to the newest sdist on PyPI; pass one (e.g. 0.3.16) to rebuild the same code.
set -euo pipefail

peer_dir=${1:-/work/peers/llama.cpp}
version=${2:-}
repo_root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$repo_root/.venv/bin/python}

case "$(realpath -m "$peer_dir")/" in
  "$repo_root"/*) echo "PEER_DIR $peer_dir is inside the repository; pick a folder outside it" >&2; exit 2;;
esac
for tool in cmake make cc c++ tar; do
  command -v $tool >/dev/null || { echo "$tool is missing: install it (apt-get install cmake build-essential)" >&2; exit 2; }
done

mkdir -p "$peer_dir"
download_dir=$peer_dir/sdist
spec=llama-cpp-python${version:+==$version}
if ! ls "$download_dir"/llama_cpp_python-${version:-*}.tar.gz >/dev/null 2>&1; then
  # Source package of llama-cpp-python only (its build tools may come as wheels: only its metadata
  # is prepared, nothing of it is compiled by pip).
  "$python" -m pip download --no-binary llama-cpp-python --no-deps --dest "$download_dir" "$spec"
fi
sdist=$(ls -t "$download_dir"/llama_cpp_python-${version:-*}.tar.gz | head -1)
echo "source package: $sdist"

src_dir=$peer_dir/src
rm -rf "$src_dir"; mkdir -p "$src_dir"
# The sdist vendors llama.cpp under vendor/llama.cpp.
tar -xzf "$sdist" -C "$src_dir" --strip-components=1
llama_dir=$src_dir/vendor/llama.cpp
[ -f "$llama_dir/CMakeLists.txt" ] || { echo "no vendor/llama.cpp in $sdist" >&2; exit 1; }

build_dir=$peer_dir/build
nice -n 19 cmake -S "$llama_dir" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=ON \
  -DBUILD_SHARED_LIBS=OFF
for target in ${LLAMA_TARGETS:-llama-server}; do
  nice -n 19 cmake --build "$build_dir" --target "$target" -j2
done
echo "$sdist" > "$peer_dir/SOURCE"
"$build_dir/bin/llama-server" --version 2>&1 | head -3 || true
echo "built: $build_dir/bin/llama-server"
