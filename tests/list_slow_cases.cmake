# SPDX-License-Identifier: MIT
# Run after a Catch2 test binary links (tests/CMakeLists.txt, cxlpool_unit_test): writes the
# names of its test cases tagged [slow], one a line, to OUT; its generated labels script gives
# those CTest tests the label slow. Usage: cmake -DEXE=<binary> -DOUT=<file> -P list_slow_cases.cmake
execute_process(COMMAND "${EXE}" "[slow]" --list-test-names-only
  OUTPUT_VARIABLE names RESULT_VARIABLE result)
# Catch2 exits with the number of cases listed; anything else (a signal) is a broken binary.
if(NOT result MATCHES "^[0-9]+$")
  message(FATAL_ERROR "${EXE} [slow] --list-test-names-only: ${result}")
endif()
file(WRITE "${OUT}" "${names}")
