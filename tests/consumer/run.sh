#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs the build tree into a scratch prefix, then builds and runs consumers with
# find_package(cxlpool) and with pkg-config, and checks that the installed cxlpool-run finds
# the installed interposer. Usage: run.sh BUILD_DIR CONSUMER_SRC WORK_DIR
set -euo pipefail
build=$1 src=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" > "$work/install.log"
echo "installed into $prefix"

cmake -S "$src" -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" > "$work/configure.log"
cmake --build "$work/cmake-build" > "$work/build.log"
"$work/cmake-build/consumer_c"
"$work/cmake-build/consumer_cpp"

libdir=$(dirname "$(find "$prefix" -name 'cxlpool.pc' | head -1)")
export PKG_CONFIG_PATH=$libdir
pc_libdir=$(pkg-config --variable=libdir cxlpool)
cc -std=c11 -Wall -Werror "$src/main.c" -o "$work/pc_consumer_c" $(pkg-config --cflags --libs cxlpool) -Wl,-rpath,"$pc_libdir"
"$work/pc_consumer_c"
c++ -std=c++20 -Wall -Werror "$src/main.cpp" -o "$work/pc_consumer_cpp" $(pkg-config --cflags --libs cxlpool) -Wl,-rpath,"$pc_libdir"
"$work/pc_consumer_cpp"

# The installed cxlpool-run preloads the installed interposer (its bin/ -> lib/ layout), not
# the build tree's.
if [ -x "$prefix/bin/cxlpool-run" ]; then
  got=$("$prefix/bin/cxlpool-run" -- /bin/sh -c 'printf %s "$LD_PRELOAD"')
  case "$got" in
    "$prefix"/*/libcxlpool_preload.so.*) echo "consumer: installed cxlpool-run preloads $got" ;;
    *) echo "consumer: installed cxlpool-run preloads '$got', not the interposer installed under $prefix" >&2; exit 1 ;;
  esac
fi
echo "consumer: find_package and pkg-config builds ran"
