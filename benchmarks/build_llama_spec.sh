#!/usr/bin/env bash
# Build llama.cpp's own speculative driver, llama-speculative-simple (whose --spec-type
# draft-mtp runs common_speculative_impl_draft_mtp, llama.cpp's MTP driver), from the vendored
# llama.cpp of the llama-cpp-python sdist the project pins, linked against the libllama /
# libggml that llama-cpp-python installed (so it runs the very library the seam runs; only
# common/ and the example compile: ~15 minutes at nice 19 on 2 busy cores). A benchmark-time
# tool (benchmarks/bench_mtp.py --spec-simple), never a test or install dependency. Prints the
# binary's path; cached in .bench-cache/.
#
#   bash benchmarks/build_llama_spec.sh [PYTHON]     # PYTHON: the venv's (default .venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:-.venv/bin/python}
version=$(sed -n 's/^llama-cpp-python==//p' constraints.txt)
cache=${ELIZA_BENCH_CACHE:-.bench-cache}
root="$cache/llama-spec-$version"
bin="$root/build/llama-speculative-simple"
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi
lib=$("$python" -c "import llama_cpp, pathlib; print(pathlib.Path(llama_cpp.__file__).parent / 'lib')")
mkdir -p "$root"
if [ ! -d "$root/src" ]; then
  python3 -m pip download --quiet --no-binary :all: --no-deps -d "$root" \
    "llama-cpp-python==$version" >&2
  tar -xzf "$root/llama_cpp_python-$version.tar.gz" -C "$root"
  mv "$root/llama_cpp_python-$version/vendor/llama.cpp" "$root/src"
  rm -rf "$root/llama_cpp_python-$version" "$root/llama_cpp_python-$version.tar.gz"
fi
src=$(cd "$root/src" && pwd)
sed -e 's/@LLAMA_BUILD_NUMBER@/0/' -e "s/@LLAMA_BUILD_COMMIT@/llama-cpp-python-$version/" \
    -e 's/@BUILD_COMPILER@/c++/' -e 's/@BUILD_TARGET@/native/' \
    "$src/common/build-info.cpp.in" > "$root/build-info.cpp"
cat > "$root/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.16)
project(llama_spec CXX C)
set(CMAKE_CXX_STANDARD 17)
set(CMAKE_BUILD_TYPE Release)
file(GLOB SRC $src/common/*.cpp $src/common/jinja/*.cpp $src/common/parsers/*.cpp
     $src/vendor/cpp-httplib/*.cpp)
add_executable(llama-speculative-simple
    $src/examples/speculative-simple/speculative-simple.cpp \${SRC} build-info.cpp)
target_include_directories(llama-speculative-simple PRIVATE $src/common $src/include
    $src/ggml/include $src/vendor $src/src)
target_link_libraries(llama-speculative-simple PRIVATE $lib/libllama.so $lib/libggml.so
    $lib/libggml-base.so $lib/libggml-cpu.so pthread)
set_target_properties(llama-speculative-simple PROPERTIES BUILD_RPATH $lib)
EOF
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$root" -B "$root/build" "${generator[@]}" >&2
nice -n 19 cmake --build "$root/build" -j "$(nproc)" >&2
echo "$bin"
