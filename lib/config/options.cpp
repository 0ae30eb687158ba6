// SPDX-License-Identifier: MIT
// The CXLPOOL_* environment options table (see options.hpp).
#include "config/options.hpp"

#include <cstdlib>

namespace cxlpool::detail {
namespace {
constexpr OptionInfo kOptions[] = {
    {Option::kDevices, "CXLPOOL_DEVICES", "emulated/declared devices: NAME:key=value,...;NAME2:... (docs/config.md)"},
    {Option::kConfigFile, "CXLPOOL_CONFIG", "path of a device file, one device per line, '#' comments"},
    {Option::kPolicy, "CXLPOOL_POLICY",
     "placement policy of the default pool (docs/policy.md), e.g. threshold:size=1M,tier=far"},
    {Option::kStats, "CXLPOOL_STATS", "interposer: print per-device statistics at exit: 1 (stderr) or a file path"},
    {Option::kPurgeDelayMs, "CXLPOOL_PURGE_DELAY_MS",
     "free memory returns to its device after being idle about twice this long (default 250; 0: at once)"},
    {Option::kTiering, "CXLPOOL_TIERING",
     "tiering engine: on, off, or key=value,... e.g. budget=200MB/s,interval=100ms (docs/tiering.md)"},
    {Option::kStatPage, "CXLPOOL_STAT_PAGE",
     "the per-process stats page cxlpool-stat reads: 1 (default) or 0 (none) (docs/stats.md)"},
    {Option::kStatInterval, "CXLPOOL_STAT_INTERVAL_MS",
     "how often the stats page is refreshed, milliseconds 10..60000 (default 1000)"},
    {Option::kControl, "CXLPOOL_CONTROL",
     "1: a control socket lets cxlpool-capacity change this process's device capacity (default 0; docs/devices.md)"},
    {Option::kNodeWatchMs, "CXLPOOL_NODE_WATCH_MS",
     "how often numa devices follow their node's memory (hot-remove/add; default 1000; 0: when asked) "
     "(docs/devices.md)"},
};
static_assert(sizeof(kOptions) / sizeof(kOptions[0]) == size_t(Option::kCount), "every option has an entry");
}  // namespace

const OptionInfo& option_info(Option option) { return kOptions[size_t(option)]; }

const char* option_value(Option option) { return secure_getenv(option_info(option).env_name); }

}  // namespace cxlpool::detail
