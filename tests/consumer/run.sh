#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs the build tree into a scratch prefix, then builds and runs consumers with
# find_package(cxlpool) and with pkg-config. Usage: run.sh BUILD_DIR CONSUMER_SRC WORK_DIR
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
echo "consumer: find_package and pkg-config builds ran"
