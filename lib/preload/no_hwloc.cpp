// SPDX-License-Identifier: MIT
// The interposer's hwloc: none. It discovers from sysfs only (no hwloc at start-up), so it
// defines the one hwloc entry point itself and lib/os/hwloc.cpp is not linked in: libhwloc
// (and libudev behind it) is then not loaded into every program, nor mapped in its address
// space (about 0.6 MiB, which counts against an RLIMIT_AS).
#include "os/hwloc.hpp"

namespace cxlpool::os {

HwlocReport hwloc_memory_facts() {
  HwlocReport r;
  r.error = "not used by the interposer (discovery from sysfs only)";
  return r;
}

}  // namespace cxlpool::os
