# SPDX-License-Identifier: MIT
# Read by cpack for each generator run (CPACK_PROJECT_CONFIG_FILE, cmake/packaging.cmake).
# Each Debian package has its own synopsis (the first line of its description): without this,
# CPackDeb would put the project's one-line description above every package's.
unset(CPACK_PACKAGE_DESCRIPTION_SUMMARY)
