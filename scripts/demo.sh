#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Sets everything up, builds (Release) and runs the demo: the machine's memory tiers as
# cxlpool sees them (with the default emulated CXL device when there is no CXL hardware),
# then maps and touches memory on every device.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=$(bash scripts/build-release.sh)
echo "== cxlpool-info"
"$BUILD/tools/cxlpool-info"
echo
echo "== touch_devices: map, touch and verify memory on every device"
"$BUILD/examples/touch_devices"
echo
echo "== threshold_pool: allocations of 1 MiB and more go to the far tier (policy threshold:size=1M,tier=far)"
"$BUILD/examples/threshold_pool"
