#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs cxlpool's build and test dependencies from Debian 12 packages. Idempotent: only
# packages that are missing are installed (apt-get update runs only then). Run as root.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config binutils python3 clang-format clang-tidy  # toolchain, nm, tests, style, lint
  libnuma-dev numactl                                   # mbind/move_pages, numactl for checks
  libhwloc-dev                                          # memory attributes
  libboost-dev                                          # Boost.Interprocess (shared pools)
  catch2                                                # Catch2 v2 test framework
  libbenchmark-dev                                      # Google Benchmark
  libjemalloc-dev libmimalloc-dev libgoogle-perftools-dev libmemkind-dev  # benchmark peers
  valgrind                                              # instruction counts (bench/run_alloc_instructions.py)
  qemu-system-x86 busybox-static cpio kmod xz-utils     # the multi-node guest test bed (tests/vm)
  ndctl daxctl                                          # cxl/ndctl/daxctl in the CXL guest (tests/vm)
  gnuplot-nox                                           # benchmark plots (bench/tiering)
  libucx-dev ucx-utils iproute2                         # KV cache transport between hosts (libcxlpool_ucx), netns tests
  pybind11-dev python3-pybind11 python3-dev             # the Python module (python/)
  stress-ng                                             # competing CPU load (scripts/test-under-load.sh)
  liburing-dev                                          # io_uring registered-buffer tests (optional: they skip without it)
  podman runc containernetworking-plugins               # containers given pools by CDI specs (tests/containers)
  lintian debootstrap help2man                          # Debian packages: lint, man pages, install into a fresh root (tests/packages)
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "install-deps: run as root to install: ${missing[*]}" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" > /tmp/cxlpool-install-deps.log 2>&1 ||
  { tail -n 30 /tmp/cxlpool-install-deps.log >&2; exit 1; }
echo "install-deps: done"
