// SPDX-License-Identifier: MIT
// A SIGSEGV handler standing for the program's own, for the tests that check cxlpool's
// chained handler (write fences, sampling) passes foreign faults on: it records that it ran
// and jumps back to the test (sigsetjmp(g_jump, 1) before the faulting access). run_fresh
// runs a hidden test case in a process where cxlpool's handler was never installed.
#pragma once

#include <setjmp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {
sigjmp_buf g_jump;
volatile sig_atomic_t g_program_handler_ran = 0;
[[maybe_unused]] void program_handler(int) {
  g_program_handler_ran = 1;
  siglongjmp(g_jump, 1);
}

// Runs one hidden test case of this binary in a new process (exec), where cxlpool's SIGSEGV
// handler has never been installed (ours goes back in front only of the handler it was in
// front of: a case that installs the program's handler first needs a fresh process when
// earlier cases in the same process installed ours). True when it passed.
[[maybe_unused]] bool run_fresh(const char* test_name) {
  pid_t child = fork();
  if (child == 0) {
    execl("/proc/self/exe", "fresh", test_name, static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  if (waitpid(child, &status, 0) != child) return false;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}
}  // namespace
