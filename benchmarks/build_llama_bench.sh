#!/usr/bin/env bash
# Build llama.cpp's own llama-bench from the vendored llama.cpp of the llama-cpp-python sdist the
# project pins (constraints.txt), with the flags that sdist's own build uses (shared libraries,
# native CPU kernels, no curl), so it runs the same kernels as the seam. A benchmark-time tool:
# never a test or install dependency. Prints the binary's path; cached in .bench-cache/.
#
#   bash benchmarks/build_llama_bench.sh        # ~6-15 minutes on 2 cores, once
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n 's/^llama-cpp-python==//p' constraints.txt)
cache=${ELIZA_BENCH_CACHE:-.bench-cache}
root="$cache/llama-bench-$version"
bin="$root/build/bin/llama-bench"
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi
mkdir -p "$root"
if [ ! -d "$root/src" ]; then
  python3 -m pip download --quiet --no-binary :all: --no-deps -d "$root" \
    "llama-cpp-python==$version" >&2
  tar -xzf "$root/llama_cpp_python-$version.tar.gz" -C "$root"
  mv "$root/llama_cpp_python-$version/vendor/llama.cpp" "$root/src"
  rm -rf "$root/llama_cpp_python-$version" "$root/llama_cpp_python-$version.tar.gz"
fi
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$root/src" -B "$root/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=OFF >&2
cmake --build "$root/build" --target llama-bench -j "$(nproc)" >&2
echo "$bin"
