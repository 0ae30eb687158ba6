// SPDX-License-Identifier: MIT
// The table of every CXLPOOL_* environment variable: name, meaning, and one accessor. New
// runtime options are added here and nowhere else (cf. mimalloc's options table).
#pragma once

namespace cxlpool::detail {

enum class Option {
  kDevices,       // CXLPOOL_DEVICES
  kConfigFile,    // CXLPOOL_CONFIG
  kPolicy,        // CXLPOOL_POLICY
  kStats,         // CXLPOOL_STATS
  kPurgeDelayMs,  // CXLPOOL_PURGE_DELAY_MS
  kTiering,       // CXLPOOL_TIERING
  kStatPage,      // CXLPOOL_STAT_PAGE
  kStatInterval,  // CXLPOOL_STAT_INTERVAL_MS
  kControl,       // CXLPOOL_CONTROL
  kNodeWatchMs,   // CXLPOOL_NODE_WATCH_MS
  kCount
};

struct OptionInfo {
  Option option;
  const char* env_name;
  const char* description;
};

const OptionInfo& option_info(Option option);
// The raw value of the option's environment variable, or nullptr when unset. Does not
// allocate (safe before malloc is ready). Ignored in setuid/setgid processes.
const char* option_value(Option option);

}  // namespace cxlpool::detail
