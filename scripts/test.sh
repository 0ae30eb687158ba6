#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Sets everything up, builds with warnings as errors, and runs the whole CTest suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
BUILD=${CXLPOOL_BUILD_DIR:-build/test}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCXLPOOL_WERROR=ON > /dev/null
cmake --build "$BUILD" -j "$(nproc)"
ctest --test-dir "$BUILD" --output-on-failure -j "$(nproc)"
