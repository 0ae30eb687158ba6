#!/bin/sh
# SPDX-License-Identifier: MIT
# The strip command of package builds (scripts/package.sh: -DCMAKE_STRIP=this): strips like
# Debian's dh_strip, which also drops the compilers' .comment and .note sections.
set -eu
exec strip --remove-section=.comment --remove-section=.note "$@"
