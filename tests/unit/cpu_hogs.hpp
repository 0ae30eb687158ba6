// SPDX-License-Identifier: MIT
// CPU hogs for tests that must hold on a saturated machine: busy processes at the test's own
// priority, started by the test and killed (and reaped) when it ends; each also dies with its
// parent and after 10 minutes whatever happens, so none outlives a crashed test.
#pragma once

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

namespace cxlpool_test {

class CpuHogs {
 public:
  // n busy processes; 0: two per online CPU, at least 4, at most 16.
  explicit CpuHogs(int n = 0) {
    if (n == 0) n = std::clamp(2 * static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)), 4, 16);
    const pid_t parent = getpid();
    for (int i = 0; i < n; ++i) {
      const pid_t pid = fork();
      if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(0);
        alarm(600);
        for (unsigned long x = 0;; ++x) asm volatile("" : "+r"(x));  // spin: the compiler keeps the loop
      }
      if (pid > 0) pids_.push_back(pid);
    }
  }
  ~CpuHogs() {
    for (pid_t pid : pids_) kill(pid, SIGKILL);
    for (pid_t pid : pids_) waitpid(pid, nullptr, 0);
  }
  size_t count() const { return pids_.size(); }
  CpuHogs(const CpuHogs&) = delete;
  CpuHogs& operator=(const CpuHogs&) = delete;

 private:
  std::vector<pid_t> pids_;
};

}  // namespace cxlpool_test
