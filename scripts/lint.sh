#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# clang-tidy over lib/ and the Python module, warnings as errors (the CTest label lint). Slow
# (minutes on 2 cores), so it is a step of .ci/run rather than part of the README's test command.
# Reuses the build of scripts/test.sh when there is one.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
BUILD=${CXLPOOL_BUILD_DIR:-build/test}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCXLPOOL_WERROR=ON > /dev/null
cmake --build "$BUILD" -j "$(nproc)"
ctest --test-dir "$BUILD" --output-on-failure -j "$(nproc)" -L lint
