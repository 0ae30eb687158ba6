# SPDX-License-Identifier: MIT
# Debian packages from the install components: `cpack -G DEB` in a build tree configured with
# -DCMAKE_INSTALL_PREFIX=/usr (scripts/package.sh does both). One package per component; each
# carries its copyright and changelog.Debian.gz. docs/packaging.md lists what goes where.
#
#   component  package            contents
#   lib        libcxlpool0        libcxlpool.so.0, the interposer libcxlpool_preload.so.0
#   dev        libcxlpool-dev     headers, libcxlpool{,_ucx}.so links, CMake package, pkg-config
#   tools      cxlpool-tools      cxlpool-info, cxlpool-run, cxlpool-stat, cxlpool-pool,
#                                 cxlpool-capacity, cxlpool-compose
#   ucx        libcxlpool-ucx0    libcxlpool_ucx.so.0 (KV cache between hosts)
#   python     python3-cxlpool    the module cxlpool in Debian's python3 path

if(NOT CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  message(STATUS "cxlpool: Debian packages install into /usr; configure with "
                 "-DCMAKE_INSTALL_PREFIX=/usr for the multiarch layout (scripts/package.sh does)")
endif()

set(soname_major ${PROJECT_VERSION_MAJOR})
set(pkg_lib libcxlpool${soname_major})            # Debian policy 8.1: the name carries the soname
set(pkg_ucx libcxlpool-ucx${soname_major})
set(pkg_dev libcxlpool-dev)
set(pkg_tools cxlpool-tools)
set(pkg_python python3-cxlpool)
set(deb_version ${PROJECT_VERSION}-${CXLPOOL_PACKAGE_RELEASE})

set(components lib dev)
if(CXLPOOL_BUILD_TOOLS)
  list(APPEND components tools)
endif()
if(TARGET cxlpool_ucx)
  list(APPEND components ucx)
endif()
if(TARGET cxlpool_python)
  list(APPEND components python)
endif()

# ---- /usr/share/doc/<package>/{copyright,changelog.Debian.gz} and lintian overrides -------
# Only in the packages: EXCLUDE_FROM_ALL keeps them out of a plain `cmake --install`.
set(pkg_files ${PROJECT_BINARY_DIR}/packaging)
file(MAKE_DIRECTORY ${pkg_files})
file(READ ${PROJECT_SOURCE_DIR}/LICENSE license_text)
string(REGEX REPLACE "^MIT License\n\nCopyright \\(c\\) ([^\n]*)\n\n" "" license_body "${license_text}")
string(REGEX MATCH "Copyright \\(c\\) ([^\n]*)" _ "${license_text}")
set(copyright_holder "${CMAKE_MATCH_1}")
string(REGEX REPLACE "\n\n" "\n.\n" license_body "${license_body}")
string(REGEX REPLACE "\n$" "" license_body "${license_body}")
string(REGEX REPLACE "\n" "\n " license_body "${license_body}")
file(WRITE ${pkg_files}/copyright
"Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: ${PROJECT_NAME}
Upstream-Contact: ${CXLPOOL_PACKAGE_MAINTAINER}

Files: *
Copyright: ${copyright_holder}
License: Expat

License: Expat
 ${license_body}
")
# The changelog's date follows SOURCE_DATE_EPOCH when set (reproducible builds).
string(TIMESTAMP changelog_date "%a, %d %b %Y %H:%M:%S +0000" UTC)
file(WRITE ${pkg_files}/changelog.Debian
"${PROJECT_NAME} (${deb_version}) unstable; urgency=medium

  * Binary packages of ${PROJECT_NAME} ${PROJECT_VERSION} built with CPack
    (scripts/package.sh); see docs/packaging.md.

 -- ${CXLPOOL_PACKAGE_MAINTAINER}  ${changelog_date}
")
find_program(CXLPOOL_GZIP gzip REQUIRED)
execute_process(COMMAND ${CXLPOOL_GZIP} -9nf -k ${pkg_files}/changelog.Debian RESULT_VARIABLE gz_rc)
if(NOT gz_rc EQUAL 0)
  message(FATAL_ERROR "cxlpool: gzip of ${pkg_files}/changelog.Debian failed")
endif()

foreach(c IN LISTS components)
  set(pkg ${pkg_${c}})
  install(FILES ${pkg_files}/copyright ${pkg_files}/changelog.Debian.gz
          DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/${pkg} COMPONENT ${c} EXCLUDE_FROM_ALL)
  set(override ${PROJECT_SOURCE_DIR}/cmake/lintian/${pkg})
  if(EXISTS ${override})
    install(FILES ${override} DESTINATION ${CMAKE_INSTALL_DATADIR}/lintian/overrides
            COMPONENT ${c} EXCLUDE_FROM_ALL)
  endif()
endforeach()

# ---- CPack ---------------------------------------------------------------------------------
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME ${PROJECT_NAME})
set(CPACK_PACKAGE_VENDOR "${copyright_holder}")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "${CXLPOOL_PACKAGE_MAINTAINER}")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_COMPONENTS_ALL ${components})
set(CPACK_PROJECT_CONFIG_FILE ${PROJECT_SOURCE_DIR}/cmake/cpack_project_config.cmake)

set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)                 # <name>_<version>-<release>_<arch>.deb
set(CPACK_DEBIAN_PACKAGE_RELEASE ${CXLPOOL_PACKAGE_RELEASE})
set(CPACK_DEBIAN_PACKAGE_SOURCE ${PROJECT_NAME})
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_COMPRESSION_TYPE xz)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
if(CXLPOOL_PACKAGE_HOMEPAGE)
  set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "${CXLPOOL_PACKAGE_HOMEPAGE}")
endif()
# Dependencies on Debian's libraries come from dpkg-shlibdeps (libc6, libstdc++6, libnuma1,
# libhwloc15, libucx0, ...); it finds our own libraries in the build tree, and the packages
# that hold them are named explicitly below, at exactly this version.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${PROJECT_BINARY_DIR}/lib)
# shlibs for other packages built against ours: "=" since the ABI may still change between
# 0.x minor versions under the same soname.
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY "=")
# Shared libraries activate the ldconfig trigger instead of calling ldconfig from scripts
# (CPack would otherwise generate postinst/postrm scripts that run it).
set(ldconfig_control ${PROJECT_SOURCE_DIR}/cmake/debian/triggers
                     ${PROJECT_SOURCE_DIR}/cmake/debian/postinst
                     ${PROJECT_SOURCE_DIR}/cmake/debian/postrm)

set(CPACK_DEBIAN_LIB_PACKAGE_NAME ${pkg_lib})
set(CPACK_DEBIAN_LIB_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_LIB_PACKAGE_CONTROL_EXTRA ${ldconfig_control})
set(CPACK_DEBIAN_LIB_DESCRIPTION "userspace library for CXL-attached (far) memory tiers
cxlpool finds the memory tiers of a machine (local DRAM, CPU-less CXL NUMA
nodes, DAX devices, shared memory pools), ranks them, and allocates from
them: pools with placement policies, a tiering engine that moves hot memory
to the fast tier, shared pools across processes and a KV cache for inference
servers. Without CXL hardware it emulates a far device on shared memory.

This package holds the shared library libcxlpool (a C ABI) and the
interposer libcxlpool_preload that serves malloc and operator new of
unmodified programs from cxlpool (see the cxlpool-run tool).")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME ${pkg_dev})
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(dev_depends "${pkg_lib} (= ${deb_version})")
if(TARGET cxlpool_ucx)
  string(APPEND dev_depends ", ${pkg_ucx} (= ${deb_version})")  # cxlpool::cxlpool_ucx in the CMake package
endif()
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "${dev_depends}")
set(CPACK_DEBIAN_DEV_DESCRIPTION "development files for cxlpool, a library for CXL memory tiers
cxlpool makes CXL-attached (far) memory usable from userspace: topology
discovery, pools with placement policies, tiering, shared pools and a KV
cache for inference servers.

This package holds the C headers and the header-only C++ layer, the CMake
package (find_package(cxlpool): cxlpool::cxlpool, cxlpool::cxlpool_ucx) and
the pkg-config modules cxlpool and cxlpool-ucx.")

set(CPACK_DEBIAN_TOOLS_PACKAGE_NAME ${pkg_tools})
set(CPACK_DEBIAN_TOOLS_PACKAGE_SECTION utils)
set(CPACK_DEBIAN_TOOLS_PACKAGE_DEPENDS "${pkg_lib} (= ${deb_version})")
set(CPACK_DEBIAN_TOOLS_DESCRIPTION "tools for cxlpool, a library for CXL memory tiers
cxlpool makes CXL-attached (far) memory usable from userspace.

This package holds the command-line tools:
 - cxlpool-info: the memory tiers, their sources, kernel tiering state and
   shared pools of this machine;
 - cxlpool-run: runs an unmodified program with its allocations on tiers;
 - cxlpool-stat: a running cxlpool program's numbers, without attaching;
 - cxlpool-pool: creates, inspects, checks and repairs shared pools;
 - cxlpool-capacity: grows and shrinks a running program's device;
 - cxlpool-compose: moves a shared pool's capacity between its quotas.
Each has a manual page and --help.")

set(CPACK_DEBIAN_UCX_PACKAGE_NAME ${pkg_ucx})
set(CPACK_DEBIAN_UCX_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_UCX_PACKAGE_DEPENDS "${pkg_lib} (= ${deb_version})")
set(CPACK_DEBIAN_UCX_PACKAGE_CONTROL_EXTRA ${ldconfig_control})
set(CPACK_DEBIAN_UCX_DESCRIPTION "KV cache transport between hosts for cxlpool, over UCX
cxlpool makes CXL-attached (far) memory usable from userspace, including a
KV cache for inference servers whose sequences are handed to another process
through a shared pool.

This package holds libcxlpool_ucx, which hands the same KV cache handles to
hosts that share no pool, over UCX (TCP, shared memory, RDMA).")

set(CPACK_DEBIAN_PYTHON_PACKAGE_NAME ${pkg_python})
set(CPACK_DEBIAN_PYTHON_PACKAGE_SECTION python)
set(CPACK_DEBIAN_PYTHON_PACKAGE_DEPENDS "${pkg_lib} (= ${deb_version}), ${CXLPOOL_PYTHON_DEPENDS}")
set(CPACK_DEBIAN_PYTHON_DESCRIPTION "Python 3 bindings of cxlpool, a library for CXL memory tiers
cxlpool makes CXL-attached (far) memory usable from userspace, including a
KV cache for inference servers in shared pools.

This package holds the Python 3 module cxlpool: shared pools, the KV block
arena, sequences, handles, and blocks as zero-copy memoryviews.")

include(CPack)
