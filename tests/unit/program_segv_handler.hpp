// SPDX-License-Identifier: MIT
// A SIGSEGV handler standing for the program's own, for the tests that check cxlpool's
// chained handler (write fences, sampling) passes foreign faults on: it records that it ran
// and jumps back to the test (sigsetjmp(g_jump, 1) before the faulting access).
#pragma once

#include <setjmp.h>
#include <signal.h>

namespace {
sigjmp_buf g_jump;
volatile sig_atomic_t g_program_handler_ran = 0;
[[maybe_unused]] void program_handler(int) {
  g_program_handler_ran = 1;
  siglongjmp(g_jump, 1);
}
}  // namespace
