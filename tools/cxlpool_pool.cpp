// SPDX-License-Identifier: MIT
// cxlpool-pool: create, inspect, check (and repair) and remove shared pools from the shell.
// Uses only the public C API (include/cxlpool/shared.h) and tools/cli_common.hpp.
#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "cli_common.hpp"
#include "cxlpool/shared.h"

namespace {

const char* kUsage =
    "usage: cxlpool-pool create DEVICE --size BYTES[K|M|G|T] [--extent BYTES] [--coherence host|fabric|none]\n"
    "                          [--mode OCTAL] [--hosts N] [--participants N] [--leases N]\n"
    "                          [--heartbeat-ms N] [--timeout-ms N] [--stopped-timeout-ms N|never]\n"
    "                          [--format-device]\n"
    "                          [--quota NAME=BYTES]... [--failure-domain NAME]\n"
    "       cxlpool-pool info DEVICE [--json] [--host-index N]\n"
    "       cxlpool-pool check DEVICE [--repair] [--json] [--host-index N]\n"
    "       cxlpool-pool rm DEVICE [--json]\n"
    "\n"
    "DEVICE is shm:NAME, file:PATH or devdax:PATH (docs/shared.md).\n"
    "  create  formats a new pool (an existing name is refused and left untouched)\n"
    "  info    joins the pool briefly and prints its geometry and use\n"
    "  check   verifies every metadata invariant; --repair first restores damaged words (with no other\n"
    "          participant alive) and recovers dead participants.\n"
    "          Exit status 0: consistent; 1: problems found; 2: usage or access error.\n"
    "  rm      removes a shm/file pool's name (only if it carries a cxlpool pool header)\n";

using cxlpool::tools::field;
using cxlpool::tools::json_text;
using cxlpool::tools::shown;
using cxlpool::tools::shown_lines;

[[noreturn]] void usage_error(const std::string& msg) {
  fprintf(stderr, "cxlpool-pool: %s\n\n%s", shown(msg).c_str(), kUsage);
  exit(2);
}

[[noreturn]] void api_error(const char* what, cxlpool_status_t st) {
  fprintf(stderr, "cxlpool-pool: %s: %s\n  %s\n", what, cxlpool_status_str(st),
          shown_lines(cxlpool_last_error_message()).c_str());
  exit(2);
}

uint64_t parse_number(const std::string& flag, const std::string& text, bool suffixes, int base = 10) {
  return cxlpool::tools::parse_number(usage_error, flag, text, suffixes, base);
}

void check_status(const char* what, cxlpool_status_t st) {
  if (st != CXLPOOL_OK) api_error(what, st);
}

const char* coherence_name(uint32_t c) {
  switch (c) {
    case CXLPOOL_COHERENCE_HOST:
      return "host";
    case CXLPOOL_COHERENCE_FABRIC:
      return "fabric";
    case CXLPOOL_COHERENCE_NONE:
      return "none";
    default:
      return "unknown";
  }
}

std::string hex_id(const uint64_t id[2]) {
  char buf[40];
  snprintf(buf, sizeof buf, "%016" PRIx64 "%016" PRIx64, id[0], id[1]);
  return buf;
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
  if (cmd != "create" && cmd != "info" && cmd != "check" && cmd != "rm") usage_error("unknown command \"" + cmd + "\"");
  if (device.empty() || device[0] == '-') usage_error(cmd + ": the DEVICE comes first, before the options");
  cxlpool_shared_params_t* params = nullptr;
  check_status("parameters", cxlpool_shared_params_create(&params));
  bool json = false, repair = false, format_device = false;
  uint32_t hosts = 1, participants = 32;
  bool hosts_set = false;
  uint32_t heartbeat = 10, timeout = 5000;
  bool timing_set = false;
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(a + " needs a value");
      return argv[++i];
    };
    auto u32 = [&](const std::string& flag, const std::string& text) {
      uint64_t v = parse_number(flag, text, false);
      if (v > UINT32_MAX) usage_error(flag + ": \"" + text + "\" is too large");
      return static_cast<uint32_t>(v);
    };
    if (a == "--json") {
      json = true;
    } else if (a == "--repair" && cmd == "check") {
      repair = true;
    } else if (a == "--format-device" && cmd == "create") {
      format_device = true;
    } else if (a == "--host-index") {
      check_status("--host-index", cxlpool_shared_params_set_host_index(params, u32(a, value())));
    } else if (cmd == "create" && a == "--size") {
      check_status("--size", cxlpool_shared_params_set_size(params, parse_number(a, value(), true)));
    } else if (cmd == "create" && a == "--extent") {
      check_status("--extent", cxlpool_shared_params_set_extent_size(params, parse_number(a, value(), true)));
    } else if (cmd == "create" && a == "--coherence") {
      const std::string c = value();
      cxlpool_coherence_t coh = c == "host"     ? CXLPOOL_COHERENCE_HOST
                                : c == "fabric" ? CXLPOOL_COHERENCE_FABRIC
                                : c == "none"   ? CXLPOOL_COHERENCE_NONE
                                              : (usage_error("--coherence: \"" + c + "\" is not host, fabric or none"),
                                                 CXLPOOL_COHERENCE_HOST);
      check_status("--coherence", cxlpool_shared_params_set_coherence(params, coh));
    } else if (cmd == "create" && a == "--mode") {
      check_status("--mode",
                   cxlpool_shared_params_set_mode(params, static_cast<unsigned>(parse_number(a, value(), false, 8))));
    } else if (cmd == "create" && a == "--hosts") {
      hosts = u32(a, value());
      hosts_set = true;
    } else if (cmd == "create" && a == "--participants") {
      participants = u32(a, value());
      hosts_set = true;
    } else if (cmd == "create" && a == "--quota") {
      const std::string q = value();
      const size_t eq = q.find('=');
      if (eq == std::string::npos) usage_error("--quota: \"" + q + "\" is not NAME=BYTES");
      check_status("--quota", cxlpool_shared_params_add_quota(params, q.substr(0, eq).c_str(),
                                                              parse_number(a, q.substr(eq + 1), true)));
    } else if (cmd == "create" && a == "--failure-domain") {
      check_status("--failure-domain", cxlpool_shared_params_set_failure_domain(params, value().c_str()));
    } else if ((cmd == "info" || cmd == "check") && a == "--quota") {
      check_status("--quota", cxlpool_shared_params_set_quota(params, value().c_str()));
    } else if (cmd == "create" && a == "--leases") {
      check_status("--leases", cxlpool_shared_params_set_leases(params, u32(a, value())));
    } else if (cmd == "create" && a == "--heartbeat-ms") {
      heartbeat = u32(a, value());
      timing_set = true;
    } else if (cmd == "create" && a == "--stopped-timeout-ms") {
      const std::string v = value();
      check_status("--stopped-timeout-ms", cxlpool_shared_params_set_stopped_timeout(
                                               params, v == "never" ? CXLPOOL_SHARED_STOPPED_NEVER : u32(a, v)));
    } else if (cmd == "create" && a == "--timeout-ms") {
      timeout = u32(a, value());
      timing_set = true;
    } else {
      usage_error("unknown option \"" + a + "\" for " + cmd);
    }
  }
  if (hosts_set)
    check_status("--hosts/--participants", cxlpool_shared_params_set_participants(params, hosts, participants));
  if (timing_set)
    check_status("--heartbeat-ms/--timeout-ms", cxlpool_shared_params_set_lease_timing(params, heartbeat, timeout));

  int rc = 0;
  if (cmd == "create") {
    cxlpool_shared_pool_t* pool = nullptr;
    check_status("create", cxlpool_shared_pool_create(device.c_str(), params,
                                                      format_device ? CXLPOOL_SHARED_FORMAT_DEVICE : 0, &pool));
    cxlpool_shared_info_t info{};
    check_status("info", cxlpool_shared_pool_info(pool, &info));
    printf("created %s: id %s, %" PRIu64 " extents of %" PRIu64 " bytes, coherence %s\n", shown(device).c_str(),
           hex_id(info.pool_id).c_str(), info.extents_total, info.extent_size, coherence_name(info.coherence));
    check_status("close", cxlpool_shared_pool_close(pool));
  } else if (cmd == "info") {
    cxlpool_shared_pool_t* pool = nullptr;
    check_status("open", cxlpool_shared_pool_open(device.c_str(), params, &pool));
    cxlpool_shared_info_t i{};
    check_status("info", cxlpool_shared_pool_info(pool, &i));
    cxlpool_shared_health_t h{};
    check_status("health", cxlpool_shared_pool_health(pool, &h));
    cxlpool_shared_quota_t quotas[16];
    size_t nq = 0;
    check_status("quotas", cxlpool_shared_pool_quotas(pool, quotas, 16, &nq));
    std::string qjson, qtext;
    for (size_t q = 0; q < nq && q < 16; ++q) {
      char buf[256];
      snprintf(buf, sizeof buf, "%s{\"name\": \"%s\", \"max_extents\": %" PRIu64 ", \"used_extents\": %" PRIu64 "}",
               q ? ", " : "", json_text(field(quotas[q].name)).c_str(), quotas[q].max_extents, quotas[q].used_extents);
      qjson += buf;
      snprintf(buf, sizeof buf, "  quota %-23s %" PRIu64 " of %" PRIu64 " extents in use\n",
               shown(field(quotas[q].name)).c_str(), quotas[q].used_extents, quotas[q].max_extents);
      qtext += buf;
    }
    if (json)
      printf("{\"device\": \"%s\", \"pool_id\": \"%s\", \"size\": %" PRIu64 ", \"extent_size\": %" PRIu64
             ", \"extents_total\": %" PRIu64 ", \"extents_free\": %" PRIu64
             ", \"participants\": %u, \"coherence\": \"%s\", \"failure_domain\": \"%s\", \"quotas\": [%s]}\n",
             json_text(device).c_str(), hex_id(i.pool_id).c_str(), i.size, i.extent_size, i.extents_total,
             i.extents_free, i.participants, coherence_name(i.coherence), json_text(field(h.failure_domain)).c_str(),
             qjson.c_str());
    else
      printf("pool %s\n  id            %s\n  size          %" PRIu64 " bytes\n  extents       %" PRIu64 " x %" PRIu64
             " bytes, %" PRIu64
             " free\n  participants  %u alive (including this one)\n  coherence     %s\n"
             "  domain        %s\n%s",
             shown(device).c_str(), hex_id(i.pool_id).c_str(), i.size, i.extents_total, i.extent_size, i.extents_free,
             i.participants, coherence_name(i.coherence), shown(field(h.failure_domain)).c_str(), qtext.c_str());
    check_status("close", cxlpool_shared_pool_close(pool));
  } else if (cmd == "check") {
    cxlpool_shared_check_report_t r{};
    cxlpool_status_t st = cxlpool_shared_pool_check(device.c_str(), params, repair ? 1 : 0, &r);
    if (st != CXLPOOL_OK && (st != CXLPOOL_E_CORRUPT || r.extents_total == 0)) api_error("check", st);  // never ran
    if (json) {
      printf("{\"device\": \"%s\", \"consistent\": %s, \"extents_total\": %" PRIu64 ", \"extents_free\": %" PRIu64
             ", \"blocks_in_use\": %" PRIu64 ", \"blocks_exported\": %" PRIu64 ", \"leases\": %" PRIu64
             ", \"leaked_blocks\": %" PRIu64 ", \"dangling_leases\": %" PRIu64 ", \"corrupt_words\": %" PRIu64
             ", \"orphan_extents\": %" PRIu64
             ", \"live_participants\": %u, \"dead_participants\": %u, \"recovered\": %" PRIu64
             ", \"repair_blocked\": %u, \"words_repaired\": %" PRIu64 ", \"words_reset\": %" PRIu64
             ", \"extents_reformatted\": %" PRIu64 ", \"blocks_lost\": %" PRIu64 "}\n",
             json_text(device).c_str(), st == CXLPOOL_OK ? "true" : "false", r.extents_total, r.extents_free,
             r.blocks_in_use, r.blocks_exported, r.leases, r.leaked_blocks, r.dangling_leases, r.corrupt_words,
             r.orphan_extents, r.live_participants, r.dead_participants, r.recovered, r.repair_blocked,
             r.words_repaired, r.words_reset, r.extents_reformatted, r.blocks_lost);
    } else {
      printf("check %s: %s\n", shown(device).c_str(), st == CXLPOOL_OK ? "consistent" : "PROBLEMS FOUND");
      printf("  extents          %" PRIu64 " total, %" PRIu64 " free, %" PRIu64 " small, %" PRIu64 " large, %" PRIu64
             " formatting\n",
             r.extents_total, r.extents_free, r.extents_small, r.extents_large, r.extents_formatting);
      printf("  blocks in use    %" PRIu64 " (%" PRIu64 " exported), %" PRIu64 " leases\n", r.blocks_in_use,
             r.blocks_exported, r.leases);
      printf("  participants     %u alive, %u dead and not recovered; %" PRIu64 " recovered now\n", r.live_participants,
             r.dead_participants, r.recovered);
      printf("  leaked blocks    %" PRIu64 "\n  dangling leases  %" PRIu64 "\n  corrupt words    %" PRIu64
             "\n  orphan extents   %" PRIu64 "\n",
             r.leaked_blocks, r.dangling_leases, r.corrupt_words, r.orphan_extents);
      if (repair)
        printf("  repaired words   %" PRIu64 " restored, %" PRIu64 " reset; %" PRIu64 " extents reformatted, %" PRIu64
               " blocks lost\n",
               r.words_repaired, r.words_reset, r.extents_reformatted, r.blocks_lost);
      if (repair && r.repair_blocked)
        printf("  (damaged words left alone: %u other participants alive or undecided; repair them with none)\n",
               r.repair_blocked);
      if (st != CXLPOOL_OK && !repair && (r.dead_participants || r.corrupt_words))
        printf("  (--repair recovers dead participants and damaged words)\n");
    }
    rc = st == CXLPOOL_OK ? 0 : 1;
  } else if (cmd == "rm") {
    check_status("rm", cxlpool_shared_pool_unlink(device.c_str()));
    if (json) printf("{\"device\": \"%s\", \"removed\": true}\n", json_text(device).c_str());
  }
  cxlpool_shared_params_destroy(params);
  return rc;
}
