#!/usr/bin/env bash
# Builds llama.cpp once per machine from the sources that the llama-cpp-python sdist vendors (PyPI is the only
# source), and installs the bindings into the venv against that one build: llama-server, llama-quantize,
# the GGUF converter and libllama all come from the same llama.cpp commit.
# Usage: scripts/build_llamacpp.sh VENV_PYTHON [--build-only]
# --build-only: the cached build alone (no bindings), so `make install` can run it beside the pip installs.
# The build is cached under $MLOPS_LLAMACPP_CACHE (default ~/.cache/mlops-llm): a second venv, a fresh clone
# or CI on the same machine install in seconds. Nothing is downloaded by cmake (UI, curl and OpenSSL are off).
set -euo pipefail
PY=${1:?usage: build_llamacpp.sh VENV_PYTHON}
VERSION=0.3.36
# Not -march=native: a VM may list AMX in cpuid without enabling its tile state, and llama.cpp's AMX q8_0
# kernels then die of SIGILL (seen here). AVX2 everywhere, AVX-512 (VNNI, BF16, VBMI) where the CPU has it.
ISA="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
if grep -qw avx512f /proc/cpuinfo 2>/dev/null && grep -qw avx512_vnni /proc/cpuinfo && grep -qw avx512_bf16 /proc/cpuinfo \
   && grep -qw avx512vbmi /proc/cpuinfo; then
  ISA="$ISA -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON"
fi
FLAGS="-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON \
-DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
-DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF $ISA \
-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON -DCMAKE_INSTALL_RPATH=\$ORIGIN"
KEY=$(printf '%s %s' "$VERSION" "$FLAGS" | sha256sum | cut -c1-10)
ROOT=${MLOPS_LLAMACPP_CACHE:-$HOME/.cache/mlops-llm}/llama.cpp-$VERSION-$KEY
SRC=$ROOT/src
BIN=$ROOT/build/bin

if [ ! -f "$ROOT/.built" ]; then
  echo "llama.cpp $VERSION: one-time build into $ROOT (about 5 min on a quiet 2-core box, 20 on a loaded one; cached afterwards)"
  rm -rf "$ROOT" && mkdir -p "$ROOT"
  "$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$ROOT/dl"
  tar xzf "$ROOT/dl/llama_cpp_python-$VERSION.tar.gz" -C "$ROOT"
  mv "$ROOT/llama_cpp_python-$VERSION" "$SRC"
  # shellcheck disable=SC2086
  cmake -S "$SRC/vendor/llama.cpp" -B "$ROOT/build" -G "$(command -v ninja >/dev/null && echo Ninja || echo 'Unix Makefiles')" $FLAGS >"$ROOT/cmake.log"
  cmake --build "$ROOT/build" -j"$(nproc)" --target llama-server llama-quantize llama ggml >"$ROOT/build.log"
  touch "$ROOT/.built"
fi
if [ "${2:-}" = "--build-only" ]; then exit 0; fi

# The bindings without their own copy of llama.cpp (LLAMA_BUILD=OFF: a pure-Python wheel), then our libraries.
if ! "$PY" -c "import llama_cpp" 2>/dev/null; then
  CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" "$PY" -m pip install -q "$SRC"
fi
LIB=$("$PY" -c "import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec('llama_cpp').origin).parent / 'lib')")
if ! cmp -s "$BIN/libggml-cpu.so" "$LIB/libggml-cpu.so"; then  # this build's libraries, not another's
  mkdir -p "$LIB" && cp -a "$BIN"/lib*.so* "$LIB"/
fi
# Where the engine finds the binaries and the converter (read by serving/engines/llamacpp_build.py).
VENV=$(dirname "$(dirname "$PY")")
printf '{"version": "%s", "root": "%s", "bin": "%s", "src": "%s"}\n' "$VERSION" "$ROOT" "$BIN" "$SRC/vendor/llama.cpp" \
  >"$VENV/llamacpp.json"
"$PY" -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__, 'on', '$BIN')"
