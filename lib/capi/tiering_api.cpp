// SPDX-License-Identifier: MIT
// C ABI of the tiering engine (cxlpool/tiering.h).
#include <cstdlib>
#include <cstring>

#include "capi/capi_guard.hpp"
#include "config/options.hpp"
#include "cxlpool/tiering.h"
#include "tiering/engine.hpp"

using namespace cxlpool::detail;

extern "C" {

cxlpool_status_t cxlpool_tiering_start(const char* config) {
  return guarded([&] {
    const char* text = config ? config : option_value(Option::kTiering);
    tiering::start(tiering::parse_config(text ? text : "", config ? "cxlpool_tiering_start" : "CXLPOOL_TIERING"));
  });
}

cxlpool_status_t cxlpool_tiering_stop(void) {
  return guarded([] { tiering::stop(); });
}

cxlpool_status_t cxlpool_tiering_stats_json(char** out) {
  return guarded([&] {
    require(out, "cxlpool_tiering_stats_json", "out is NULL");
    std::string json = tiering::stats_json();
    char* s = static_cast<char*>(std::malloc(json.size() + 1));
    if (!s) throw std::bad_alloc();
    std::memcpy(s, json.c_str(), json.size() + 1);
    *out = s;
  });
}

cxlpool_status_t cxlpool_hint_access(const void* p, size_t len, uint32_t weight) {
  std::string why;
  cxlpool_status_t s = tiering::hint_access(p, len, weight, &why);
  if (s != CXLPOOL_OK) set_last_error(s, 0, why.c_str());
  return s;
}

cxlpool_status_t cxlpool_pin(const void* p, size_t len, int tier) {
  return guarded([&] { tiering::pin(p, len, tier); });
}

}  // extern "C"
