// SPDX-License-Identifier: MIT
// cxlpool-compose: shows and changes how a shared pool's capacity is granted to its quotas
// (docs/compose.md). Joins the pool as a participant for the length of one command; uses only
// the public C API (include/cxlpool/compose.h) and tools/cli_common.hpp.
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cli_common.hpp"
#include "cxlpool/compose.h"

namespace {

const char* kUsage =
    "usage: cxlpool-compose list DEVICE [--json] [--host-index N]\n"
    "       cxlpool-compose grant DEVICE QUOTA AMOUNT [--extents] [--wait S] [--json] [--host-index N]\n"
    "       cxlpool-compose reclaim DEVICE QUOTA AMOUNT [--extents] [--deadline S] [--wait S] [--json]\n"
    "                               [--host-index N]\n"
    "\n"
    "DEVICE is a shared pool (shm:NAME, file:PATH, devdax:PATH; docs/shared.md). AMOUNT is bytes\n"
    "(K, M, G, T: binary multiples), a whole number of the pool's extents, or with --extents a count of\n"
    "extents.\n"
    "  list     every quota's reserved, granted and used extents, and what is unassigned\n"
    "  grant    raises QUOTA's grant from the unassigned extents (refused when too few are)\n"
    "  reclaim  lowers QUOTA's grant and waits up to --deadline seconds (default 30) until its\n"
    "           participants hold no more: they give back what they keep for speed at once, the rest\n"
    "           as their programs free it. At the deadline the quota keeps a grant for what it still\n"
    "           holds, and the reclaim reports what it took.\n"
    "  --wait S  how long to wait for another composer's claim (default 10 s: a dead one's is\n"
    "            dropped when its slot is recovered, within the pool's lease timeout)\n"
    "\n"
    "Exit status: 0 done; 1 usage error or refused (too few unassigned, unknown quota, damaged grant);\n"
    "2 busy (the reclaim's deadline passed with extents still held, or the compose claim stayed held);\n"
    "3 the pool could not be opened.\n";

using cxlpool::tools::field;
using cxlpool::tools::json_text;
using cxlpool::tools::shown;
using cxlpool::tools::shown_lines;

[[noreturn]] void usage_error(const std::string& msg) {
  fprintf(stderr, "cxlpool-compose: %s\n\n%s", shown(msg).c_str(), kUsage);
  exit(1);
}

[[noreturn]] void api_error(const std::string& what, cxlpool_status_t st, int code) {
  fprintf(stderr, "cxlpool-compose: %s: %s\n  %s\n", shown(what).c_str(), cxlpool_status_str(st),
          shown_lines(cxlpool_last_error_message()).c_str());
  exit(code);
}

int exit_code(cxlpool_status_t st) { return st == CXLPOOL_E_BUSY ? 2 : 1; }

uint32_t seconds_ms(const std::string& flag, const std::string& text) {
  const uint64_t s = cxlpool::tools::parse_number(usage_error, flag, text, false);
  if (s > UINT32_MAX / 1000) usage_error(flag + ": \"" + text + "\" seconds is too long");
  return static_cast<uint32_t>(s * 1000);
}

void print_state(const std::string& device, const cxlpool_compose_state_t& st, bool json) {
  if (json) {
    printf("{\"device\": \"%s\", \"extent_size\": %" PRIu64 ", \"extents_total\": %" PRIu64
           ", \"extents_unassigned\": %" PRIu64 ", \"extents_over_grant\": %" PRIu64 ", \"overcommitted\": %s",
           json_text(device).c_str(), st.extent_size, st.extents_total, st.extents_unassigned, st.extents_over_grant,
           st.overcommitted ? "true" : "false");
    printf(", \"quotas\": [");
    for (uint32_t q = 0; q < st.quota_count; ++q) {
      const cxlpool_compose_quota_t& c = st.quotas[q];
      printf("%s{\"name\": \"%s\", \"reserved_extents\": %" PRIu64 ", \"granted_extents\": %" PRIu64
             ", \"used_extents\": %" PRIu64 ", \"grant_set\": %s, \"grant_damaged\": %s}",
             q ? ", " : "", json_text(field(c.name)).c_str(), c.reserved_extents, c.granted_extents, c.used_extents,
             c.grant_set ? "true" : "false", c.grant_damaged ? "true" : "false");
    }
    printf("]}\n");
    return;
  }
  printf("pool %s: %" PRIu64 " extents of %" PRIu64 " bytes, %" PRIu64 " unassigned, %" PRIu64 " held over grant%s\n",
         shown(device).c_str(), st.extents_total, st.extent_size, st.extents_unassigned, st.extents_over_grant,
         st.overcommitted ? " (OVERCOMMITTED: a damaged pool; cxlpool-pool check)" : "");
  printf("  %-24s %10s %10s %10s\n", "quota", "reserved", "granted", "used");
  for (uint32_t q = 0; q < st.quota_count; ++q) {
    const cxlpool_compose_quota_t& c = st.quotas[q];
    printf("  %-24s %10" PRIu64 " %10" PRIu64 " %10" PRIu64 "%s\n", shown(field(c.name)).c_str(), c.reserved_extents,
           c.granted_extents, c.used_extents, c.grant_damaged ? "  (grant word damaged)" : "");
  }
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      fputs(kUsage, stdout);
      return 0;
    }
  if (argc < 3) usage_error("a command and a DEVICE are needed");
  const std::string cmd = argv[1], device = argv[2];
  if (cmd != "list" && cmd != "grant" && cmd != "reclaim") usage_error("unknown command \"" + cmd + "\"");
  if (device.empty() || device[0] == '-') usage_error(cmd + ": the DEVICE comes first, before the options");
  int i = 3;
  std::string quota, amount;
  if (cmd != "list") {
    if (argc < 5 || argv[3][0] == '-' || argv[4][0] == '-') usage_error(cmd + ": DEVICE QUOTA AMOUNT are needed");
    quota = argv[3];
    amount = argv[4];
    i = 5;
  }
  bool json = false, in_extents = false;
  uint32_t wait_ms = 10000, deadline_ms = 30000;
  cxlpool_shared_params_t* params = nullptr;
  if (cxlpool_shared_params_create(&params) != CXLPOOL_OK) api_error("params", CXLPOOL_E_NO_MEMORY, 3);
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--json") {
      json = true;
    } else if (a == "--host-index") {
      const uint64_t h = cxlpool::tools::parse_number(usage_error, a, value(), false);
      if (h > UINT32_MAX) usage_error("--host-index: too large");
      const cxlpool_status_t st = cxlpool_shared_params_set_host_index(params, static_cast<uint32_t>(h));
      if (st != CXLPOOL_OK) api_error("--host-index", st, 1);
    } else if (cmd != "list" && a == "--extents") {
      in_extents = true;
    } else if (a == "--wait") {
      wait_ms = seconds_ms(a, value());
    } else if (cmd == "reclaim" && a == "--deadline") {
      deadline_ms = seconds_ms(a, value());
    } else {
      usage_error("unknown option \"" + a + "\" for " + cmd);
    }
  }
  const uint64_t number = cmd == "list" ? 0 : cxlpool::tools::parse_number(usage_error, "AMOUNT", amount, !in_extents);

  cxlpool_shared_pool_t* pool = nullptr;
  cxlpool_status_t st = cxlpool_shared_pool_open(device.c_str(), params, &pool);
  cxlpool_shared_params_destroy(params);
  if (st != CXLPOOL_OK) api_error("open " + device, st, 3);
  cxlpool_compose_state_t before{};
  st = cxlpool_compose_get_state(pool, wait_ms, &before);
  if (st != CXLPOOL_OK) api_error("list", st, 1);
  int rc = 0;
  if (cmd == "list") {
    print_state(device, before, json);
  } else {
    uint64_t extents = number;
    if (!in_extents) {
      if (number % before.extent_size != 0)
        usage_error("AMOUNT: " + amount + " is not a whole number of the pool's extents (" +
                    std::to_string(before.extent_size) + " bytes each)");
      extents = number / before.extent_size;
    }
    uint64_t reclaimed = 0;
    if (cmd == "grant")
      st = cxlpool_compose_grant(pool, quota.c_str(), extents, wait_ms);
    else
      st = cxlpool_compose_reclaim(pool, quota.c_str(), extents, deadline_ms, wait_ms, &reclaimed);
    const std::string message = st == CXLPOOL_OK ? "" : cxlpool_last_error_message();
    // A reclaim that took part of it before its deadline changed the grant: say so, then fail.
    if (st != CXLPOOL_OK && !(cmd == "reclaim" && st == CXLPOOL_E_BUSY && reclaimed > 0)) {
      cxlpool_shared_pool_close(pool);
      fprintf(stderr, "cxlpool-compose: %s: %s\n  %s\n", cmd.c_str(), cxlpool_status_str(st),
              shown_lines(message).c_str());
      return exit_code(st);
    }
    cxlpool_compose_state_t after{};
    if (cxlpool_compose_get_state(pool, wait_ms, &after) != CXLPOOL_OK) api_error("list", st, 1);
    uint64_t granted = 0;
    for (uint32_t q = 0; q < after.quota_count; ++q)
      if (quota == std::string(field(after.quotas[q].name))) granted = after.quotas[q].granted_extents;
    const uint64_t done = cmd == "grant" ? extents : reclaimed;
    if (json)
      printf("{\"device\": \"%s\", \"quota\": \"%s\", \"%s_extents\": %" PRIu64 ", \"asked_extents\": %" PRIu64
             ", \"granted_extents\": %" PRIu64 ", \"extents_unassigned\": %" PRIu64 "}\n",
             json_text(device).c_str(), json_text(quota).c_str(), cmd == "grant" ? "granted_now" : "reclaimed", done,
             extents, granted, after.extents_unassigned);
    else
      printf("%s %" PRIu64 " of %" PRIu64 " extents %s quota %s: granted %" PRIu64 ", %" PRIu64 " unassigned\n",
             cmd == "grant" ? "granted" : "reclaimed", done, extents, cmd == "grant" ? "to" : "from",
             shown(quota).c_str(), granted, after.extents_unassigned);
    if (st != CXLPOOL_OK) {
      fprintf(stderr, "cxlpool-compose: %s: %s\n  %s\n", cmd.c_str(), cxlpool_status_str(st),
              shown_lines(message).c_str());
      rc = exit_code(st);
    }
  }
  cxlpool_shared_pool_close(pool);
  return rc;
}
