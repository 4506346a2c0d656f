#!/usr/bin/env bash
# Build llama.cpp's own tools (llama-bench by default; also llama-server and llama-batched-bench)
# from the vendored llama.cpp of the llama-cpp-python sdist the project pins (constraints.txt),
# with the flags that sdist's own build uses (shared libraries, native CPU kernels, no curl), so
# they run the same kernels as the seam. The server is built without its web UI (no download)
# and without OpenSSL. Benchmark-time tools: never a test or install dependency. Prints the
# binaries' paths, one a line, in the order asked; cached in .bench-cache/ (ELIZA_BENCH_CACHE).
# The compile runs under `nice`, so other work on the machine keeps its share.
#
#   bash benchmarks/build_llama_bench.sh                        # llama-bench, ~6-15 min on 2 cores
#   bash benchmarks/build_llama_bench.sh llama-server llama-batched-bench
set -euo pipefail
cd "$(dirname "$0")/.."
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(llama-bench)
for target in "${targets[@]}"; do
  case "$target" in
    llama-bench|llama-server|llama-batched-bench) ;;
    *) echo "error: unknown target $target (llama-bench, llama-server, llama-batched-bench)" >&2
       exit 2 ;;
  esac
done
version=$(sed -n 's/^llama-cpp-python==//p' constraints.txt)
cache=${ELIZA_BENCH_CACHE:-.bench-cache}
root="$cache/llama-bench-$version"
missing=()
for target in "${targets[@]}"; do
  [ -x "$root/build/bin/$target" ] || missing+=("$target")
done
if [ ${#missing[@]} -gt 0 ]; then
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
  nice -n 15 cmake -S "$root/src" -B "$root/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF >&2
  nice -n 15 cmake --build "$root/build" --target "${missing[@]}" -j "$(nproc)" >&2
fi
for target in "${targets[@]}"; do
  echo "$root/build/bin/$target"
done
