// SPDX-License-Identifier: MIT
// Names of the public enums (statuses, sources) and the version string, shared by the C ABI
// and by internal renderers (JSON, messages).
#pragma once

#include "cxlpool/common.h"

namespace cxlpool::detail {
const char* status_name(cxlpool_status_t status) noexcept;
const char* source_name(cxlpool_source_t source) noexcept;
const char* version_string() noexcept;
}  // namespace cxlpool::detail
