#!/usr/bin/env bash
# Build llama-cpp-python (the llama.cpp engine, `--backend llamacpp`) for this machine and install it.
#
#   scripts/install_llama_cpp.sh PYTHON [VERSION]
#
# PyPI has only its source, which compiles llama.cpp. This builds the library alone (no llava/mtmd, no
# llama.cpp `common`, which the binding never loads) for this CPU (-march=native; AMX off: its CPU kernel
# crashed on Q4_1 on a Sapphire Rapids Xeon), about 1.5 min on 2 cores. The wheel is kept in
# $SPECDECODE_CACHE/llama-cpp-wheels (default ~/.cache/specdecode) under a key of the version, the flags,
# the compiler and the CPU's instruction sets, so later set-ups on this machine install it in seconds and
# a machine with another CPU builds its own.
set -euo pipefail

PYTHON=${1:?usage: $0 PYTHON [VERSION]}
VERSION=${2:-0.3.36}

FLAGS="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_COMMON=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON"
CFLAGS_EXTRA=""
if [ "$(uname -m)" = "x86_64" ]; then
    CFLAGS_EXTRA="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
fi

cpu_features=$( (gcc -march=native -Q --help=target 2>/dev/null | grep -E '^\s+-m' | grep -v disabled) || uname -m)
key=$(printf '%s\n' "$VERSION" "$FLAGS" "$CFLAGS_EXTRA" "$(gcc --version | head -1)" "$cpu_features" \
      | sha256sum | cut -c1-16)
cache=${SPECDECODE_CACHE:-$HOME/.cache/specdecode}/llama-cpp-wheels/$VERSION-$key
wheel=$(ls "$cache"/llama_cpp_python-*.whl 2>/dev/null | head -1 || true)

if [ -z "$wheel" ]; then
    echo "building llama-cpp-python $VERSION for this CPU (once; about 1.5 min on 2 cores) ..." >&2
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    "$PYTHON" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$work"
    tar xzf "$work"/llama_cpp_python-"$VERSION".tar.gz -C "$work"
    source_dir="$work/llama_cpp_python-$VERSION"
    # llama-cpp-python forces llama.cpp's common library on (several minutes of compiling) though the
    # binding never loads it; drop that line, and fail loudly if a new version changed it.
    force='set(LLAMA_BUILD_COMMON ON CACHE BOOL "Build llama.cpp common library" FORCE)'
    if ! grep -qF "$force" "$source_dir/CMakeLists.txt"; then
        echo "error: $source_dir/CMakeLists.txt no longer forces LLAMA_BUILD_COMMON; update $0" >&2
        exit 1
    fi
    grep -vF "$force" "$source_dir/CMakeLists.txt" > "$work/CMakeLists.txt"
    mv "$work/CMakeLists.txt" "$source_dir/CMakeLists.txt"
    started=$(date +%s)
    CMAKE_ARGS="$FLAGS -DCMAKE_C_FLAGS='$CFLAGS_EXTRA' -DCMAKE_CXX_FLAGS='$CFLAGS_EXTRA'" \
    CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
        "$PYTHON" -m pip wheel -q --no-deps --no-cache-dir -w "$work/wheel" "$source_dir"
    mkdir -p "$(dirname "$cache")"
    rm -rf "$cache.tmp" && mv "$work/wheel" "$cache.tmp" && rm -rf "$cache" && mv "$cache.tmp" "$cache"
    echo "built in $(( $(date +%s) - started )) s; kept in $cache" >&2
    wheel=$(ls "$cache"/llama_cpp_python-*.whl | head -1)
fi
"$PYTHON" -m pip install -q "$wheel"
