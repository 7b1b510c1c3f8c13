#!/usr/bin/env bash
# Installs ARGUS from a build tree into a fresh prefix, then, from a fresh directory:
#  - the shared library exports the C API only (every defined dynamic symbol is argus_*), under a
#    versioned SONAME;
#  - examples/c/decode.c builds and runs against the installed tree with pkg-config alone and
#    with CMake's find_package alone.
# Usage: installed_tree_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(cd "$1" && pwd) source=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

cmake --install "$build" --prefix "$prefix" >/dev/null
lib=$(find "$prefix" -name 'libargus.so.*.*.*' | head -1)
pc_dir=$(dirname "$(find "$prefix" -name argus.pc | head -1)")
[[ -f $lib && -d $pc_dir ]] || { echo "FAIL: libargus.so or argus.pc not installed"; exit 1; }

exported=$(nm -D --defined-only "$lib" | awk '{print $3}')
stray=$(grep -v '^argus_' <<<"$exported" || true)
if [[ -n $stray ]]; then
  echo "FAIL: libargus.so exports symbols outside the C API:"
  head -20 <<<"$stray"
  exit 1
fi
n_api=$(grep -c '^argus_' <<<"$exported")
n_declared=$(grep -oE '\bargus_[a-z0-9_]+\(' "$source/include/argus/argus.h" | sort -u | wc -l)
[[ $n_api -eq $n_declared ]] || { echo "FAIL: $n_api symbols exported, $n_declared declared"; exit 1; }
soname=$(objdump -p "$lib" | awk '/SONAME/ {print $2}')
[[ $soname == libargus.so.0 ]] || { echo "FAIL: SONAME is '$soname'"; exit 1; }
echo "libargus.so: $n_api symbols, all argus_*, SONAME $soname"

cp -r "$source/examples/c" "$work/example"
cd "$work/example"
export LD_LIBRARY_PATH=$(dirname "$lib")

PKG_CONFIG_PATH=$pc_dir cc -std=c11 -Wall -Wextra -pedantic -Werror decode.c \
  $(PKG_CONFIG_PATH=$pc_dir pkg-config --cflags --libs argus) -lm -o decode_pkgconfig
./decode_pkgconfig | tee pkgconfig.out
grep -q ': ok$' pkgconfig.out

cmake -S . -B build -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build build >/dev/null
./build/decode > cmake.out
cmp pkgconfig.out cmake.out
echo "PASS: installed tree used through pkg-config and through CMake"

# The Python package: installed beside the library, and by pip (offline) with ARGUS_LIBRARY.
python=/usr/bin/python3
if $python -c "import numpy" 2>/dev/null; then
  check='import argus; c = argus.KvCache(1, 4, 2, 64); s = c.create_sequence(); print("python", argus.__version__, c.stats()["n_sequences"])'
  (cd "$work" && env -u LD_LIBRARY_PATH PYTHONPATH="$(dirname "$(find "$prefix" -type d -name argus -path '*dist-packages*')")" $python -c "$check")
  cp -r "$source/python" "$work/python"  # pip builds in the tree it is given
  $python -m pip install -q --no-build-isolation --no-deps --target "$work/pip" "$work/python" 2>&1 | grep -v -i warning || true
  (cd "$work" && env -u LD_LIBRARY_PATH PYTHONPATH="$work/pip" ARGUS_LIBRARY="$lib" $python -c "$check")
  echo "PASS: the Python package installed by cmake --install and by pip"
else
  echo "SKIP: the Python package (no NumPy for $python)"
fi
