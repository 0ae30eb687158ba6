// SPDX-License-Identifier: MIT
// The kernel's own access monitors, detected and explained: DAMON (vaddr operations), perf
// memory sampling (PEBS/IBS) and NUMA balancing. None is instantiated on the development
// machines (docs/tiering.md, "Monitors"): no PMU; a kdamond already running that is not ours
// and no vaddr operations; numa_balancing off, and it never yields per-range heat to a process.
// Every reason names the knob or errno to act on. sysfs/procfs are read through os::FsRoot.
#include <cerrno>
#include <cstring>
#include <string>

#include "os/fs_root.hpp"
#include "os/vm_query.hpp"
#include "tiering/monitor_internal.hpp"

#ifndef CAP_PERFMON
#define CAP_PERFMON 38
#endif
#ifndef CAP_SYS_ADMIN
#define CAP_SYS_ADMIN 21
#endif

namespace cxlpool::detail::tiering {
namespace {

std::string or_q(const std::optional<std::string>& v) { return v ? *v : std::string("?"); }

}  // namespace

std::string errno_name(int e) {
  if (e == 0) return "0";
  const char* n = strerrorname_np(e);
  return n ? std::string(n) : std::to_string(e);
}

MonitorAvailability detect_damon() {
  MonitorAvailability a;
  const os::FsRoot sys("/sys"), proc("/proc");
  const std::string admin = "kernel/mm/damon/admin";
  if (!sys.exists(admin)) {
    a.reason = "no /sys/kernel/mm/damon/admin (kernel built without CONFIG_DAMON_SYSFS)";
    return a;
  }
  auto nr = sys.read(admin + "/kdamonds/nr_kdamonds");
  if (!nr) {
    a.reason =
        "/sys/kernel/mm/damon/admin/kdamonds/nr_kdamonds is not readable (mode 0600: DAMON needs root, "
        "CAP_SYS_ADMIN" +
        std::string(os::vm_query::has_capability(CAP_SYS_ADMIN) ? " held but the file was refused)" : " missing)");
    return a;
  }
  // Operations this kernel offers, from any context that exists (read-only look).
  std::string ops;
  for (const auto& k : sys.list(admin + "/kdamonds"))
    for (const auto& c : sys.list(admin + "/kdamonds/" + k + "/contexts"))
      if (auto v = sys.read(admin + "/kdamonds/" + k + "/contexts/" + c + "/avail_operations")) ops = *v;
  const bool vaddr_known_missing = !ops.empty() && ops.find("vaddr") == std::string::npos;
  if (*nr != "0") {
    a.reason = "DAMON in use by someone else: nr_kdamonds=" + *nr;
    for (const auto& k : sys.list(admin + "/kdamonds")) {
      if (k == "nr_kdamonds") continue;
      const std::string d = admin + "/kdamonds/" + k;
      std::string op;
      for (const auto& c : sys.list(d + "/contexts"))
        if (auto v = sys.read(d + "/contexts/" + c + "/operations")) op = *v;
      a.reason += " (kdamond." + k + ": pid " + or_q(sys.read(d + "/pid")) + ", state " + or_q(sys.read(d + "/state")) +
                  (op.empty() ? "" : ", operations " + op) + ")";
    }
    a.reason += "; cxlpool never touches a kdamond it did not create";
    if (vaddr_known_missing)
      a.reason += ", and this kernel has no vaddr operations (avail_operations: " + ops + "; CONFIG_DAMON_VADDR off)";
    return a;
  }
  if (vaddr_known_missing) {
    a.reason = "no vaddr operations in this kernel (avail_operations: " + ops + "; CONFIG_DAMON_VADDR off)";
    return a;
  }
  // Free and permitted: the driver would create kdamond 0 with vaddr operations on our pid.
  a.reason =
      "DAMON is free here (nr_kdamonds=0) but cxlpool's DAMON driver is not built: it could not be verified "
      "on the development machines (a kdamond already runs there); use pagemap_scan or sample";
  return a;
}

MonitorAvailability detect_perf() {
  MonitorAvailability a;
  const os::FsRoot proc("/proc"), sys("/sys");
  const int e = os::vm_query::probe_hw_cycles();
  const std::string paranoid = or_q(proc.read("sys/kernel/perf_event_paranoid"));
  if (e == ENOENT || e == EOPNOTSUPP) {
    a.reason = "no PMU: perf_event_open(PERF_COUNT_HW_CPU_CYCLES) = " + errno_name(e) +
               " (no hardware events exposed to this kernel, e.g. a VM without a virtual PMU); memory sampling "
               "(PEBS/IBS) needs one";
    return a;
  }
  if (e == EACCES || e == EPERM) {
    a.reason = "kernel.perf_event_paranoid=" + paranoid + " and no CAP_PERFMON: perf_event_open = " + errno_name(e);
    return a;
  }
  if (e) {
    a.reason = "perf_event_open(PERF_COUNT_HW_CPU_CYCLES) = " + errno_name(e);
    return a;
  }
  const bool ibs = sys.exists("bus/event_source/devices/ibs_op");
  const bool pebs = sys.exists("bus/event_source/devices/cpu/events/mem-loads") ||
                    sys.exists("bus/event_source/devices/cpu_core/events/mem-loads");
  if (!ibs && !pebs) {
    a.reason =
        "a PMU but no memory sampling: neither AMD IBS (/sys/bus/event_source/devices/ibs_op) nor Intel PEBS "
        "(cpu/events/mem-loads)";
    return a;
  }
  a.reason = std::string(ibs ? "AMD IBS" : "Intel PEBS") + " is present (kernel.perf_event_paranoid=" + paranoid +
             "), but cxlpool's perf memory-sampling driver is not built (no such hardware on the development machines)";
  return a;
}

MonitorAvailability detect_numa_balancing() {
  MonitorAvailability a;
  const os::FsRoot proc("/proc"), sys("/sys");
  auto mode = proc.read("sys/kernel/numa_balancing");
  if (!mode) {
    a.reason = "no /proc/sys/kernel/numa_balancing (kernel built without CONFIG_NUMA_BALANCING)";
    return a;
  }
  std::string tiers;
  for (const auto& t : sys.list("devices/virtual/memory_tiering")) {
    if (t.rfind("memory_tier", 0) != 0) continue;
    tiers += (tiers.empty() ? "" : ", ") + t + " (nodes " +
             or_q(sys.read("devices/virtual/memory_tiering/" + t + "/nodelist")) + ")";
  }
  const std::string demotion = or_q(sys.read("kernel/mm/numa/demotion_enabled"));
  const int m = std::atoi(mode->c_str());
  const std::string facts = "kernel.numa_balancing=" + *mode + ", /sys/kernel/mm/numa/demotion_enabled=" + demotion +
                            ", memory tiers: " + (tiers.empty() ? std::string("none") : tiers);
  const std::string no_heat =
      "its NUMA hint faults give a process no per-range heat (only system-wide counters in /proc/vmstat)";
  a.available = (m & 2) != 0;
  if (a.available)
    a.reason = "the kernel tiers NUMA nodes itself (" + facts + "); " + no_heat;
  else if (m & 1)
    a.reason = facts + ": NUMA balancing (mode 1) moves pages to the CPUs using them, it does not tier; " + no_heat;
  else
    a.reason = facts + ": the kernel does not balance nor tier NUMA nodes; " + no_heat;
  return a;
}

}  // namespace cxlpool::detail::tiering
