// SPDX-License-Identifier: MIT
// cxlpool-compose: shows and changes how a shared pool's capacity is granted to its quotas
// (docs/compose.md). Joins the pool as a participant for the length of one command; uses only
// the public C API (include/cxlpool/compose.h) and tools/cli_common.hpp.
#include <signal.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cdi_spec.hpp"
#include "cli_common.hpp"
#include "cxlpool/compose.h"

namespace {

const char* kUsage =
    "usage: cxlpool-compose list DEVICE [--wait S] [--json] [--host-index N]\n"
    "       cxlpool-compose grant DEVICE QUOTA AMOUNT [--extents] [--wait S] [--json] [--host-index N]\n"
    "       cxlpool-compose reclaim DEVICE QUOTA AMOUNT [--extents] [--deadline S] [--wait S] [--json]\n"
    "                               [--host-index N]\n"
    "       cxlpool-compose policy set DEVICE QUOTA [--min AMOUNT] [--max AMOUNT] [--priority P] [--extents]\n"
    "                                  [--wait S] [--json] [--host-index N]\n"
    "       cxlpool-compose daemon DEVICE [--period MS] [--hold-ms MS] [--for S] [--wait S] [--json]\n"
    "                              [--host-index N]\n"
    "       cxlpool-compose watch DEVICE [--interval S] [--for S] [--wait S] [--json] [--host-index N]\n"
    "       cxlpool-compose lock DEVICE QUOTA [--wait S] [--json] [--host-index N]\n"
    "       cxlpool-compose unlock DEVICE QUOTA [--wait S] [--json] [--host-index N]\n"
    "       cxlpool-compose cdi DEVICE --quota QUOTA[=NAME] [--quota ...] [--dir DIR] [--kind KIND] [--print]\n"
    "                           [--wait S] [--json] [--host-index N]\n"
    "       cxlpool-compose cdi DEVICE --remove [--dir DIR] [--kind KIND]\n"
    "       cxlpool-compose reset-keys DEVICE [--json]\n"
    "\n"
    "DEVICE is a shared pool (shm:NAME, file:PATH, devdax:PATH; docs/shared.md). AMOUNT is bytes\n"
    "(K, M, G, T: binary multiples), a whole number of the pool's extents, or with --extents a count of\n"
    "extents.\n"
    "  list     every quota's reserved, granted, used and asked-for extents, its policy, and what is\n"
    "           unassigned\n"
    "  grant    raises QUOTA's grant from the unassigned extents (refused when too few are)\n"
    "  reclaim  lowers QUOTA's grant and waits up to --deadline seconds (default 30) until its\n"
    "           participants hold no more: they give back what they keep for speed at once, the rest\n"
    "           as their programs free it. At the deadline the quota keeps a grant for what it still\n"
    "           holds, and the reclaim reports what it took.\n"
    "  policy set  QUOTA's minimum (granted first, never reclaimed), maximum (0: the pool) and\n"
    "           priority (0..255); options not given are kept\n"
    "  daemon   runs the policy every --period ms (default 100) until SIGINT/SIGTERM or --for S:\n"
    "           demand (participants whose claims failed on their grant) is served by priority; a\n"
    "           quota's spare extents with no demand for --hold-ms (default 500) go back. One line per\n"
    "           change (JSON lines with --json)\n"
    "  watch    list every --interval S (default 1)\n"
    "  lock     gives QUOTA a new key and prints it: from now on a program joins QUOTA only with it\n"
    "           (CXLPOOL_QUOTA_KEY); an older key stops working, programs already joined stay\n"
    "  unlock   opens QUOTA to any program again\n"
    "  cdi      hands quotas to containers: locks each QUOTA with a new key and writes a CDI spec\n"
    "           (KIND, default cxlpool.io/pool) naming one device per quota, NAME (default POOL-QUOTA):\n"
    "           the pool's file mounted at the same path (a devdax node passed as a device) and the\n"
    "           environment to join that quota. Written atomically, mode 0600, to DIR (default /etc/cdi)\n"
    "           or with --print to standard output; run a container with --device KIND=NAME.\n"
    "           --remove deletes the spec cxlpool-compose wrote for DEVICE (lock revokes its keys)\n"
    "  reset-keys  unlocks every quota without joining the pool: the way back from a lost key (it\n"
    "           needs write access to DEVICE, as any change to the pool does)\n"
    "  A program that joined a locked quota with its key (a container) cannot grant, reclaim, set\n"
    "  policies or keys: the host composes from default (CXLPOOL_QUOTA_KEY when default is locked).\n"
    "  --wait S  how long to wait for another composer's claim (default 10 s: a dead one's is\n"
    "            dropped when its slot is recovered, within the pool's lease timeout)\n"
    "\n"
    "Exit status: 0 done; 1 usage error or refused (too few unassigned, unknown quota, damaged grant,\n"
    "a spec file that is not cxlpool-compose's);\n"
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
             ", \"used_extents\": %" PRIu64 ", \"demand_extents\": %" PRIu64 ", \"min_extents\": %" PRIu64
             ", \"max_extents\": %" PRIu64
             ", \"priority\": %u, \"grant_set\": %s, \"grant_damaged\": %s"
             ", \"policy_damaged\": %s, \"locked\": %s, \"key_damaged\": %s}",
             q ? ", " : "", json_text(field(c.name)).c_str(), c.reserved_extents, c.granted_extents, c.used_extents,
             c.demand_extents, c.min_extents, c.max_extents, c.priority, c.grant_set ? "true" : "false",
             c.grant_damaged ? "true" : "false", c.policy_damaged ? "true" : "false", c.locked ? "true" : "false",
             c.key_damaged ? "true" : "false");
    }
    printf("]}\n");
    fflush(stdout);
    return;
  }
  printf("pool %s: %" PRIu64 " extents of %" PRIu64 " bytes, %" PRIu64 " unassigned, %" PRIu64 " held over grant%s\n",
         shown(device).c_str(), st.extents_total, st.extent_size, st.extents_unassigned, st.extents_over_grant,
         st.overcommitted ? " (OVERCOMMITTED: a damaged pool; cxlpool-pool check)" : "");
  printf("  %-24s %9s %9s %9s %9s %9s %9s %8s\n", "quota", "reserved", "granted", "used", "demand", "min", "max",
         "priority");
  for (uint32_t q = 0; q < st.quota_count; ++q) {
    const cxlpool_compose_quota_t& c = st.quotas[q];
    const std::string max = c.max_extents ? std::to_string(c.max_extents) : "-";
    printf("  %-24s %9" PRIu64 " %9" PRIu64 " %9" PRIu64 " %9" PRIu64 " %9" PRIu64 " %9s %8u%s%s%s\n",
           shown(field(c.name)).c_str(), c.reserved_extents, c.granted_extents, c.used_extents, c.demand_extents,
           c.min_extents, max.c_str(), c.priority, c.grant_damaged ? "  (grant word damaged)" : "",
           c.policy_damaged ? "  (policy damaged)" : "",
           c.key_damaged ? "  (key word damaged: lock it again)"
           : c.locked    ? "  locked"
                         : "");
  }
  fflush(stdout);
}

volatile sig_atomic_t g_stop = 0;
void on_stop(int) { g_stop = 1; }

uint64_t now_ms() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000 + uint64_t(ts.tv_nsec) / 1000000;
}

// Sleeps ms, or less when a stop signal arrives.
void nap(uint64_t ms) {
  for (uint64_t end = now_ms() + ms; !g_stop && now_ms() < end;) {
    const uint64_t left = std::min<uint64_t>(end - now_ms(), 50);
    timespec ts{time_t(left / 1000), long(left % 1000) * 1000000};
    nanosleep(&ts, nullptr);
  }
}

struct Options {
  std::string cmd, device, quota, amount;
  bool json = false, in_extents = false;
  uint32_t wait_ms = 10000, deadline_ms = 30000, period_ms = 100, hold_ms = 500, interval_ms = 1000;
  uint64_t for_ms = 0;  // 0: until a signal
  std::string min, max;
  int64_t priority = -1;
  std::vector<std::pair<std::string, std::string>> cdi_quotas;  // quota, device name ("" = POOL-QUOTA)
  std::string cdi_dir = "/etc/cdi", cdi_kind = cxlpool::tools::cdi::kDefaultKind;
  bool cdi_print = false, cdi_remove = false, cdi_dir_given = false;
};

// POOL in the default device names: the location's last component, kept to CDI's characters
// and beginning and ending with a letter or digit.
std::string pool_label(const std::string& location) {
  std::string base = location.substr(location.find_last_of(":/") + 1), out;
  for (char c : base) out += isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' ? c : '_';
  out = out.substr(0, 40);
  while (!out.empty() && !isalnum(static_cast<unsigned char>(out.back()))) out.pop_back();
  if (out.empty() || !isalnum(static_cast<unsigned char>(out[0]))) out = "pool" + out;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      fputs(kUsage, stdout);
      return 0;
    }
  Options o;
  int i = 1;
  if (argc < 3) usage_error("a command and a DEVICE are needed");
  o.cmd = argv[i++];
  if (o.cmd == "policy") {
    if (i >= argc || strcmp(argv[i], "set") != 0) usage_error("policy: only \"policy set\" is known");
    o.cmd = "policy set";
    ++i;
  }
  if (o.cmd != "list" && o.cmd != "grant" && o.cmd != "reclaim" && o.cmd != "policy set" && o.cmd != "daemon" &&
      o.cmd != "watch" && o.cmd != "lock" && o.cmd != "unlock" && o.cmd != "cdi" && o.cmd != "reset-keys")
    usage_error("unknown command \"" + o.cmd + "\"");
  if (i >= argc || argv[i][0] == '-') usage_error(o.cmd + ": the DEVICE comes first, before the options");
  o.device = argv[i++];
  const bool has_quota =
      o.cmd == "grant" || o.cmd == "reclaim" || o.cmd == "policy set" || o.cmd == "lock" || o.cmd == "unlock";
  const bool has_amount = o.cmd == "grant" || o.cmd == "reclaim";
  // QUOTA and AMOUNT are positional: a quota's name may begin with '-'.
  if (has_quota) {
    if (i >= argc) usage_error(o.cmd + ": DEVICE QUOTA" + (has_amount ? " AMOUNT" : "") + " are needed");
    o.quota = argv[i++];
  }
  if (has_amount) {
    if (i >= argc) usage_error(o.cmd + ": DEVICE QUOTA AMOUNT are needed");
    o.amount = argv[i++];
  }
  cxlpool_shared_params_t* params = nullptr;
  if (cxlpool_shared_params_create(&params) != CXLPOOL_OK) api_error("params", CXLPOOL_E_NO_MEMORY, 3);
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(a + " needs a value");
      return argv[++i];
    };
    auto ms = [&](uint64_t scale) {
      const std::string v = value();
      const uint64_t n = cxlpool::tools::parse_number(usage_error, a, v, false);
      if (n > UINT32_MAX / scale) usage_error(a + ": \"" + v + "\" is too long");
      return static_cast<uint32_t>(n * scale);
    };
    if (a == "--json") {
      o.json = true;
    } else if (a == "--host-index") {
      const uint64_t h = cxlpool::tools::parse_number(usage_error, a, value(), false);
      if (h > UINT32_MAX) usage_error("--host-index: too large");
      const cxlpool_status_t st = cxlpool_shared_params_set_host_index(params, static_cast<uint32_t>(h));
      if (st != CXLPOOL_OK) api_error("--host-index", st, 1);
    } else if (a == "--wait") {
      o.wait_ms = ms(1000);
    } else if ((has_amount || o.cmd == "policy set") && a == "--extents") {
      o.in_extents = true;
    } else if (o.cmd == "reclaim" && a == "--deadline") {
      o.deadline_ms = ms(1000);
    } else if (o.cmd == "policy set" && (a == "--min" || a == "--max")) {
      (a == "--min" ? o.min : o.max) = value();
    } else if (o.cmd == "policy set" && a == "--priority") {
      const uint64_t p = cxlpool::tools::parse_number(usage_error, a, value(), false);
      if (p > 255) usage_error("--priority: " + std::to_string(p) + " is above 255");
      o.priority = int64_t(p);
    } else if (o.cmd == "daemon" && a == "--period") {
      o.period_ms = std::max<uint32_t>(1, ms(1));
    } else if (o.cmd == "daemon" && a == "--hold-ms") {
      o.hold_ms = ms(1);
    } else if (o.cmd == "watch" && a == "--interval") {
      o.interval_ms = std::max<uint32_t>(1, ms(1000));
    } else if ((o.cmd == "daemon" || o.cmd == "watch") && a == "--for") {
      o.for_ms = ms(1000);
    } else if (o.cmd == "cdi" && a == "--quota") {
      const std::string v = value();
      const size_t eq = v.find('=');
      o.cdi_quotas.emplace_back(v.substr(0, eq), eq == std::string::npos ? "" : v.substr(eq + 1));
    } else if (o.cmd == "cdi" && a == "--dir") {
      o.cdi_dir = value();
      o.cdi_dir_given = true;
    } else if (o.cmd == "cdi" && a == "--kind") {
      o.cdi_kind = value();
    } else if (o.cmd == "cdi" && a == "--print") {
      o.cdi_print = true;
    } else if (o.cmd == "cdi" && a == "--remove") {
      o.cdi_remove = true;
    } else {
      usage_error("unknown option \"" + a + "\" for " + o.cmd);
    }
  }
  if (o.cmd == "policy set" && o.min.empty() && o.max.empty() && o.priority < 0)
    usage_error("policy set: nothing to set (--min, --max or --priority)");
  namespace cdi = cxlpool::tools::cdi;
  if (o.cmd == "cdi") {
    if (!cdi::valid_kind(o.cdi_kind))
      usage_error("--kind: \"" + o.cdi_kind +
                  "\" is not a CDI kind: VENDOR/CLASS, VENDOR a domain name (letters, digits, '-', at least two "
                  "labels), CLASS 2-63 letters, digits, _ - beginning with a letter and ending with a letter or "
                  "digit (e.g. cxlpool.io/pool)");
    std::string why;
    if (cdi::host_object(o.device, &why).path.empty()) usage_error("cdi: " + why);
    const std::string file = cdi::file_name(o.cdi_kind, pool_label(o.device), o.device);
    if (o.cdi_remove) {
      if (!o.cdi_quotas.empty() || o.cdi_print) usage_error("cdi --remove takes no --quota or --print");
      cxlpool_shared_params_destroy(params);  // (the pool is not opened)
      why = cdi::remove_spec(o.cdi_dir, file, o.cdi_kind);
      if (!why.empty()) {
        fprintf(stderr, "cxlpool-compose: cdi: %s\n", shown(why).c_str());
        return 1;
      }
      if (o.json)
        printf("{\"removed\": \"%s\"}\n", json_text(o.cdi_dir + "/" + file).c_str());
      else
        printf("removed %s\n", shown(o.cdi_dir + "/" + file).c_str());
      return 0;
    }
    if (o.cdi_quotas.empty()) usage_error("cdi: at least one --quota QUOTA[=NAME] is needed");
    for (auto& [quota, name] : o.cdi_quotas) {
      if (name.empty()) name = pool_label(o.device) + "-" + quota;
      if (!cdi::valid_device_name(name))
        usage_error("cdi: device name \"" + name + "\": need 2-63 of letters, digits, _ - . beginning and ending " +
                    "with a letter or digit (give one with --quota QUOTA=NAME)");
    }
    for (size_t a = 0; a < o.cdi_quotas.size(); ++a)
      for (size_t b = a + 1; b < o.cdi_quotas.size(); ++b) {
        if (o.cdi_quotas[a].first == o.cdi_quotas[b].first)
          usage_error("cdi: quota \"" + o.cdi_quotas[a].first + "\" given twice");
        if (o.cdi_quotas[a].second == o.cdi_quotas[b].second)
          usage_error("cdi: device name \"" + o.cdi_quotas[a].second + "\" given twice");
      }
  }
  if (o.cmd == "reset-keys") {  // without joining: the pool may be one nobody can join any more
    cxlpool_shared_params_destroy(params);
    uint32_t n = 0;
    const cxlpool_status_t st = cxlpool_compose_reset_keys(o.device.c_str(), &n);
    if (st != CXLPOOL_OK) api_error("reset-keys " + o.device, st, st == CXLPOOL_E_CORRUPT ? 1 : 3);
    if (o.json)
      printf("{\"device\": \"%s\", \"unlocked\": %u}\n", json_text(o.device).c_str(), n);
    else
      printf("%s: %u quota(s) unlocked\n", shown(o.device).c_str(), n);
    return 0;
  }
  // Numbers are checked before the pool is opened; whole extents once its extent size is known.
  const uint64_t number = has_amount ? cxlpool::tools::parse_number(usage_error, "AMOUNT", o.amount, !o.in_extents) : 0;
  const uint64_t min_n = o.min.empty() ? 0 : cxlpool::tools::parse_number(usage_error, "--min", o.min, !o.in_extents);
  const uint64_t max_n = o.max.empty() ? 0 : cxlpool::tools::parse_number(usage_error, "--max", o.max, !o.in_extents);

  cxlpool_shared_pool_t* pool = nullptr;
  cxlpool_status_t st = cxlpool_shared_pool_open(o.device.c_str(), params, &pool);
  cxlpool_shared_params_destroy(params);
  if (st != CXLPOOL_OK) api_error("open " + o.device, st, 3);
  cxlpool_compose_state_t before{};
  st = cxlpool_compose_get_state(pool, o.wait_ms, &before);
  if (st != CXLPOOL_OK) {
    cxlpool_shared_pool_close(pool);
    api_error(o.cmd, st, exit_code(st));
  }
  auto extents_of = [&](const std::string& flag, const std::string& text, uint64_t n) {
    if (o.in_extents) return n;
    if (n % before.extent_size != 0) {
      cxlpool_shared_pool_close(pool);
      usage_error(flag + ": " + text + " is not a whole number of the pool's extents (" +
                  std::to_string(before.extent_size) + " bytes each)");
    }
    return n / before.extent_size;
  };
  auto fail_with = [&](cxlpool_status_t s) {
    const std::string message = cxlpool_last_error_message();
    cxlpool_shared_pool_close(pool);
    fprintf(stderr, "cxlpool-compose: %s: %s\n  %s\n", o.cmd.c_str(), cxlpool_status_str(s),
            shown_lines(message).c_str());
    return exit_code(s);
  };
  signal(SIGINT, on_stop);
  signal(SIGTERM, on_stop);
  int rc = 0;
  const uint64_t started = now_ms();
  auto running = [&] { return !g_stop && (o.for_ms == 0 || now_ms() - started < o.for_ms); };
  if (o.cmd == "list") {
    print_state(o.device, before, o.json);
  } else if (o.cmd == "lock" || o.cmd == "unlock") {
    char key[CXLPOOL_QUOTA_KEY_SIZE] = {};
    st = o.cmd == "lock" ? cxlpool_compose_lock_quota(pool, o.quota.c_str(), o.wait_ms, key)
                         : cxlpool_compose_unlock_quota(pool, o.quota.c_str(), o.wait_ms);
    if (st != CXLPOOL_OK) return fail_with(st);
    if (o.json)
      printf("{\"device\": \"%s\", \"quota\": \"%s\", \"locked\": %s%s%s%s}\n", json_text(o.device).c_str(),
             json_text(o.quota).c_str(), o.cmd == "lock" ? "true" : "false", o.cmd == "lock" ? ", \"key\": \"" : "",
             key, o.cmd == "lock" ? "\"" : "");
    else if (o.cmd == "lock")
      printf("%s\n", key);
    else
      printf("quota %s: unlocked\n", shown(o.quota).c_str());
  } else if (o.cmd == "cdi") {
    std::string why;
    const cdi::HostObject obj = cdi::host_object(o.device, &why);
    const std::string file = cdi::file_name(o.cdi_kind, pool_label(o.device), o.device);
    auto refuse = [&](const std::string& text) {
      cxlpool_shared_pool_close(pool);
      fprintf(stderr, "cxlpool-compose: cdi: %s\n  (no key was changed)\n", shown(text).c_str());
      return 1;
    };
    // Everything that can be checked is, before any key changes: the quotas, the directory,
    // the spec's name, the device names other specs of the kind use.
    for (const auto& q : o.cdi_quotas) {
      bool known = false;
      for (uint32_t k = 0; k < before.quota_count; ++k)
        known = known || q.first == std::string(field(before.quotas[k].name));
      if (!known) return refuse("the pool has no quota named \"" + q.first + "\"");
    }
    cdi::SpecSite site;
    if (!o.cdi_print) {
      why = site.prepare(o.cdi_dir, !o.cdi_dir_given, file, o.cdi_kind);
      if (!why.empty()) return refuse(why);
      std::vector<std::string> names;
      for (const auto& q : o.cdi_quotas) names.push_back(q.second);
      const std::string taken = site.taken_name(o.cdi_kind, names);
      if (!taken.empty())
        return refuse("device name " + taken + " is another spec's of kind " + o.cdi_kind +
                      ": give this pool's devices other names (--quota QUOTA=NAME)");
    }
    if (!o.cdi_print) {
      std::vector<cdi::QuotaDevice> stand_in;
      for (const auto& [quota, name] : o.cdi_quotas) stand_in.push_back({name, quota, std::string(32, '0')});
      why = site.reserve(cdi::spec_json(o.cdi_kind, o.device, obj, stand_in));
      if (!why.empty()) return refuse(why);
    }
    std::vector<cdi::QuotaDevice> devices;
    for (const auto& [quota, name] : o.cdi_quotas) {
      char key[CXLPOOL_QUOTA_KEY_SIZE] = {};
      st = cxlpool_compose_lock_quota(pool, quota.c_str(), o.wait_ms, key);
      if (st != CXLPOOL_OK) {
        if (!devices.empty())
          fprintf(stderr, "cxlpool-compose: cdi: %zu quota(s) already locked with new keys; run cdi again\n",
                  devices.size());
        return fail_with(st);
      }
      devices.push_back({name, quota, key});
    }
    const std::string text = cdi::spec_json(o.cdi_kind, o.device, obj, devices);
    if (o.cdi_print) {
      fputs(text.c_str(), stdout);
    } else {
      why = site.commit(text);
      if (!why.empty()) {
        cxlpool_shared_pool_close(pool);
        fprintf(stderr, "cxlpool-compose: cdi: %s\n  (the quotas were locked with new keys; run cdi again)\n",
                shown(why).c_str());
        return 1;
      }
      if (o.json) {
        printf("{\"spec\": \"%s\", \"devices\": [", json_text(o.cdi_dir + "/" + file).c_str());
        for (size_t k = 0; k < devices.size(); ++k)
          printf("%s{\"device\": \"%s=%s\", \"quota\": \"%s\"}", k ? ", " : "", json_text(o.cdi_kind).c_str(),
                 json_text(devices[k].name).c_str(), json_text(devices[k].quota).c_str());
        printf("]}\n");
      } else {
        printf("wrote %s\n", shown(o.cdi_dir + "/" + file).c_str());
        for (const auto& d : devices)
          printf("  --device %s=%s   quota %s\n", shown(o.cdi_kind).c_str(), shown(d.name).c_str(),
                 shown(d.quota).c_str());
      }
    }
  } else if (o.cmd == "watch") {
    print_state(o.device, before, o.json);
    for (;;) {
      nap(o.interval_ms);
      if (!running()) break;
      cxlpool_compose_state_t s{};
      st = cxlpool_compose_get_state(pool, o.wait_ms, &s);
      if (st == CXLPOOL_E_BUSY) {  // another composer held the claim: said, not fatal
        fprintf(stderr, "cxlpool-compose: watch: %s\n", shown_lines(cxlpool_last_error_message()).c_str());
        continue;
      }
      if (st != CXLPOOL_OK) return fail_with(st);
      print_state(o.device, s, o.json);
    }
  } else if (o.cmd == "daemon") {
    cxlpool_composer_t* c = nullptr;
    st = cxlpool_composer_create(pool, o.hold_ms, &c);
    if (st != CXLPOOL_OK) return fail_with(st);
    uint64_t changes = 0;
    while (running()) {
      cxlpool_compose_move_t moves[32];
      size_t n = 0;
      st = cxlpool_composer_step(c, o.wait_ms, moves, 32, &n);
      if (st == CXLPOOL_E_BUSY) {  // another composer held the claim: not fatal for a daemon
        fprintf(stderr, "cxlpool-compose: daemon: %s\n", shown_lines(cxlpool_last_error_message()).c_str());
      } else if (st != CXLPOOL_OK) {
        cxlpool_composer_destroy(c);
        return fail_with(st);
      }
      for (size_t k = 0; k < n && k < 32; ++k, ++changes) {
        if (o.json)
          printf("{\"ms\": %" PRIu64 ", \"quota\": \"%s\", \"delta_extents\": %" PRId64 ", \"why\": \"%s\"}\n",
                 now_ms() - started, json_text(field(moves[k].quota)).c_str(), moves[k].delta_extents,
                 json_text(field(moves[k].why)).c_str());
        else
          printf("%8.3f s  %-24s %+6" PRId64 " extents  (%s)\n", double(now_ms() - started) / 1000,
                 shown(field(moves[k].quota)).c_str(), moves[k].delta_extents, shown(field(moves[k].why)).c_str());
      }
      fflush(stdout);
      nap(o.period_ms);
    }
    cxlpool_composer_destroy(c);
    if (!o.json) printf("daemon: %" PRIu64 " changes\n", changes);
  } else if (o.cmd == "policy set") {
    // Only the fields given are sent: the library keeps the others, under the claim.
    cxlpool_compose_policy_t p{};
    uint32_t fields = 0;
    if (!o.min.empty()) p.min_extents = extents_of("--min", o.min, min_n), fields |= CXLPOOL_COMPOSE_POLICY_MIN;
    if (!o.max.empty()) p.max_extents = extents_of("--max", o.max, max_n), fields |= CXLPOOL_COMPOSE_POLICY_MAX;
    if (o.priority >= 0) p.priority = uint32_t(o.priority), fields |= CXLPOOL_COMPOSE_POLICY_PRIORITY;
    st = cxlpool_compose_set_policy(pool, o.quota.c_str(), &p, fields, o.wait_ms);
    if (st == CXLPOOL_OK) {  // what the quota has now
      cxlpool_compose_state_t now{};
      if (cxlpool_compose_get_state(pool, o.wait_ms, &now) == CXLPOOL_OK)
        for (uint32_t q = 0; q < now.quota_count; ++q)
          if (o.quota == std::string(field(now.quotas[q].name)))
            p = {now.quotas[q].min_extents, now.quotas[q].max_extents, now.quotas[q].priority, 0};
    }
    if (st != CXLPOOL_OK) return fail_with(st);
    if (o.json)
      printf("{\"device\": \"%s\", \"quota\": \"%s\", \"min_extents\": %" PRIu64 ", \"max_extents\": %" PRIu64
             ", \"priority\": %u}\n",
             json_text(o.device).c_str(), json_text(o.quota).c_str(), p.min_extents, p.max_extents, p.priority);
    else
      printf("quota %s: minimum %" PRIu64 ", maximum %s, priority %u\n", shown(o.quota).c_str(), p.min_extents,
             p.max_extents ? std::to_string(p.max_extents).c_str() : "the pool", p.priority);
  } else {
    const uint64_t extents = extents_of("AMOUNT", o.amount, number);
    uint64_t reclaimed = 0;
    if (o.cmd == "grant")
      st = cxlpool_compose_grant(pool, o.quota.c_str(), extents, o.wait_ms);
    else
      st = cxlpool_compose_reclaim(pool, o.quota.c_str(), extents, o.deadline_ms, o.wait_ms, &reclaimed);
    const std::string message = st == CXLPOOL_OK ? "" : cxlpool_last_error_message();
    // A reclaim that took part of it before its deadline changed the grant: say so, then fail.
    if (st != CXLPOOL_OK && !(o.cmd == "reclaim" && st == CXLPOOL_E_BUSY && reclaimed > 0)) return fail_with(st);
    // The change is made: it is reported even when the state after it cannot be read (another
    // composer holding the claim), with those figures left out (null in JSON).
    cxlpool_compose_state_t after{};
    const bool seen = cxlpool_compose_get_state(pool, o.wait_ms, &after) == CXLPOOL_OK;
    if (!seen)
      fprintf(stderr, "cxlpool-compose: %s: done, but the state after it could not be read: %s\n", o.cmd.c_str(),
              shown_lines(cxlpool_last_error_message()).c_str());
    std::string granted = "null", unassigned = "null";
    for (uint32_t q = 0; seen && q < after.quota_count; ++q)
      if (o.quota == std::string(field(after.quotas[q].name)))
        granted = std::to_string(after.quotas[q].granted_extents);
    if (seen) unassigned = std::to_string(after.extents_unassigned);
    const uint64_t done = o.cmd == "grant" ? extents : reclaimed;
    if (o.json)
      printf("{\"device\": \"%s\", \"quota\": \"%s\", \"%s_extents\": %" PRIu64 ", \"asked_extents\": %" PRIu64
             ", \"granted_extents\": %s, \"extents_unassigned\": %s}\n",
             json_text(o.device).c_str(), json_text(o.quota).c_str(), o.cmd == "grant" ? "granted_now" : "reclaimed",
             done, extents, granted.c_str(), unassigned.c_str());
    else
      printf("%s %" PRIu64 " of %" PRIu64 " extents %s quota %s: granted %s, %s unassigned\n",
             o.cmd == "grant" ? "granted" : "reclaimed", done, extents, o.cmd == "grant" ? "to" : "from",
             shown(o.quota).c_str(), seen ? granted.c_str() : "?", seen ? unassigned.c_str() : "?");
    if (st != CXLPOOL_OK) {
      fprintf(stderr, "cxlpool-compose: %s: %s\n  %s\n", o.cmd.c_str(), cxlpool_status_str(st),
              shown_lines(message).c_str());
      rc = exit_code(st);
    }
  }
  cxlpool_shared_pool_close(pool);
  // A key printed nowhere is a key lost: a full or closed standard output is a failure.
  if (fflush(stdout) != 0 || ferror(stdout)) {
    const bool keyed = o.cmd == "lock" || (o.cmd == "cdi" && o.cdi_print);
    fprintf(stderr, "cxlpool-compose: %s: standard output could not be written (%s)%s\n", o.cmd.c_str(),
            strerror(errno), keyed ? "; the quota is locked with a key nobody got: lock it again" : "");
    return 1;
  }
  return rc;
}
