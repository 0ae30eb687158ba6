/* SPDX-License-Identifier: MIT */
/* cxlpool public C API umbrella header: include this one. The C++ layer is cxlpool.hpp. */
#ifndef CXLPOOL_H
#define CXLPOOL_H
#include "cxlpool/alloc.h"
#include "cxlpool/backing.h"
#include "cxlpool/common.h"
#include "cxlpool/compose.h"
#include "cxlpool/device.h"
#include "cxlpool/kvcache.h"
#include "cxlpool/shared.h"
#include "cxlpool/tiering.h"
#include "cxlpool/topology.h"
#endif
