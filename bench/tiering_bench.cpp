// SPDX-License-Identifier: MIT
// bench/tiering: a GUPS-like workload (random 8-byte updates, 90% of them to a hot set) over a
// footprint four times the fast tier, with the hot set placed wrongly at start and shifted
// half-way. Each placement runs in its own forked process: static first-touch (spill),
// 1:1 interleave, bandwidth-weighted interleave, an oracle (the hot set pinned to the fast
// tier at start and at the shift), and cxlpool's tiering engine (pagemap_scan heat). Reported
// from the library's residency map (cxlpool_ptr_info per block, every 100 ms): the share of
// hot-set accesses served by the fast tier, time to converge after the shift, bytes moved;
// the measured update rate (both tiers are DRAM here, so it shows overhead, not speed); the
// monitor overhead (engine with migrate=off vs no engine); and a MODELLED throughput from the
// devices' declared latencies (labelled "model"). Table on stdout, --json, --plot (gnuplot).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench_output.hpp"
#include "cxlpool/cxlpool.h"

namespace {

constexpr size_t kMiB = size_t(1) << 20;
constexpr size_t kBlock = 4 * kMiB;

struct Options {
  size_t footprint = 1024 * kMiB;
  double seconds = 12;
  int threads = 1;
  double fast_latency_ns = 90, slow_latency_ns = 300;  // declared: the model's parameters
  std::vector<int> hot_percents{10, 25};
  std::vector<std::string> placements{"static", "interleave", "interleave-bw", "oracle", "cxlpool", "monitor-only"};
  std::string json, plot;
  std::string tiering = "interval=100ms,monitors=pagemap_scan";
  double series = 0;   // > 0: print each run's hot-set share on the fast tier every this many seconds
  int repeat = 1;      // the placement list, this many times over, interleaved (overhead from medians)
  int hot_share = 90;  // % of updates that go to the hot set
};

struct Sample {
  double t;          // seconds since start
  double hot_fast;   // share of the hot set's bytes on the fast tier
  double served;     // share of all accesses served by the fast tier (0.9 hot + 0.1 uniform)
  double updates;    // measured updates/s in the last period
  double model_rel;  // model: throughput relative to all-fast
};

struct Result {
  std::string placement;
  int hot_percent = 0;
  std::vector<Sample> samples;
  double converge_s = -1;  // after the shift, until hot_fast >= 0.9 (-1: never)
  double hot_fast_phase1 = 0, hot_fast_phase2 = 0, model_phase2 = 0, updates_mean = 0;
  uint64_t moved_bytes = 0;
  std::string error;
};

uint64_t xorshift(uint64_t& s) {
  s ^= s << 13;
  s ^= s >> 7;
  s ^= s << 17;
  return s;
}

std::string number_after(const std::string& json, const std::string& key) {
  size_t at = json.find("\"" + key + "\"");
  if (at == std::string::npos) return "0";
  at = json.find(':', at) + 1;
  while (json[at] == ' ') ++at;
  size_t end = at;
  while (end < json.size() && (isdigit(json[end]) || json[end] == '.')) ++end;
  return json.substr(at, end - at);
}

// One placement in this (forked) process; writes its result to fd as text lines.
Result run_one(const Options& o, const std::string& placement, int hot_percent) {
  Result r;
  r.placement = placement;
  r.hot_percent = hot_percent;
  const size_t fast = o.footprint / 4;
  if (placement == "cxlpool" || placement == "monitor-only") {
    std::string cfg = o.tiering + (placement == "monitor-only" ? ",migrate=off" : "");
    if (cxlpool_tiering_start(cfg.c_str()) != CXLPOOL_OK) {
      r.error = cxlpool_last_error_message();
      return r;
    }
  }
  char devices[512];
  std::snprintf(devices, sizeof devices,
                "fast:backing=shm,size=%zuM,tier=0,latency=%.0fns,bandwidth=60GB/s;"
                "slow:backing=shm,size=%zuM,tier=1,latency=%.0fns,bandwidth=30GB/s",
                fast / kMiB, o.fast_latency_ns, 2 * o.footprint / kMiB, o.slow_latency_ns);
  cxlpool_config_t* c = nullptr;
  cxlpool_config_create(&c);
  cxlpool_config_set_devices(c, devices);
  cxlpool_config_set_flags(c, CXLPOOL_CONFIG_IGNORE_ENV | CXLPOOL_CONFIG_NO_HWLOC | CXLPOOL_CONFIG_NO_DEFAULT_DEVICE);
  cxlpool_topology_t* topo = nullptr;
  if (cxlpool_topology_discover(c, &topo) != CXLPOOL_OK) {
    r.error = cxlpool_last_error_message();
    return r;
  }
  const char* policy = placement == "interleave"      ? "interleave:fast=1,slow=1"
                       : placement == "interleave-bw" ? "interleave:auto"
                       : placement == "oracle"        ? "bind:slow"
                                                      : "spill:near=fast,far=slow,watermark=95%";
  cxlpool_pool_params_t* p = nullptr;
  cxlpool_pool_params_create(&p);
  cxlpool_pool_params_set_devices(p, "fast,slow");
  cxlpool_pool_params_set_policy(p, policy);
  cxlpool_pool_t* pool = nullptr;
  if (cxlpool_pool_create(topo, p, &pool) != CXLPOOL_OK) {
    r.error = cxlpool_last_error_message();
    return r;
  }
  const size_t nblocks = o.footprint / kBlock;
  std::vector<uint64_t*> blocks;
  for (size_t i = 0; i < nblocks; ++i) {
    auto* b = static_cast<uint64_t*>(cxlpool_malloc(pool, kBlock));
    if (!b) {
      r.error = "allocation failed";
      return r;
    }
    std::memset(b, 1, kBlock);
    blocks.push_back(b);
  }
  // Hot sets: the last blocks allocated (placed on the slow tier by first touch), then the
  // ones before them.
  const size_t hot_n = std::max<size_t>(1, nblocks * size_t(hot_percent) / 100);
  std::atomic<size_t> hot_first{nblocks - hot_n};
  auto pin_hot = [&](size_t first, size_t old_first) {
    if (old_first != SIZE_MAX)
      for (size_t i = old_first; i < old_first + hot_n; ++i) cxlpool_pin(blocks[i], kBlock, 1);
    for (size_t i = first; i < first + hot_n; ++i) cxlpool_pin(blocks[i], kBlock, 0);
  };
  if (placement == "oracle") pin_hot(hot_first, SIZE_MAX);
  std::atomic<bool> stop{false};
  std::vector<std::atomic<uint64_t>> done(size_t(o.threads));
  std::vector<std::thread> workers;
  const size_t words = kBlock / 8;
  for (int t = 0; t < o.threads; ++t)
    workers.emplace_back([&, t] {
      uint64_t s = 0x9e3779b97f4a7c15ull * uint64_t(t + 1), n = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        for (int k = 0; k < 4096; ++k) {
          uint64_t x = xorshift(s);
          size_t first = hot_first.load(std::memory_order_relaxed);
          size_t b = (x % 100 < uint64_t(o.hot_share)) ? first + (x >> 8) % hot_n : (x >> 8) % nblocks;
          blocks[b][(x >> 24) % words] ^= x;
        }
        n += 4096;
        done[size_t(t)].store(n, std::memory_order_relaxed);
      }
    });
  auto t0 = std::chrono::steady_clock::now();
  uint64_t last_total = 0;
  double last_t = 0;
  bool shifted = false;
  const double shift_at = o.seconds / 2;
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    double now = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!shifted && now >= shift_at) {
      size_t old = hot_first;
      size_t next = nblocks - 2 * hot_n;
      hot_first = next;
      shifted = true;
      if (placement == "oracle") pin_hot(next, old);
    }
    uint64_t total = 0;
    for (auto& d : done) total += d.load(std::memory_order_relaxed);
    size_t first = hot_first, hot_on_fast = 0, all_on_fast = 0;
    for (size_t i = 0; i < nblocks; ++i) {
      cxlpool_ptr_info_t in{};
      cxlpool_ptr_info(blocks[i], &in);
      bool on_fast = in.tier == 0;
      all_on_fast += on_fast;
      if (i >= first && i < first + hot_n) hot_on_fast += on_fast;
    }
    Sample s;
    s.t = now;
    s.hot_fast = double(hot_on_fast) / double(hot_n);
    const double hs = double(o.hot_share) / 100;
    s.served = hs * s.hot_fast + (1 - hs) * double(all_on_fast) / double(nblocks);
    s.updates = double(total - last_total) / (now - last_t);
    s.model_rel = o.fast_latency_ns / (s.served * o.fast_latency_ns + (1 - s.served) * o.slow_latency_ns);
    r.samples.push_back(s);
    last_total = total;
    last_t = now;
    if (shifted && r.converge_s < 0 && s.hot_fast >= 0.9) r.converge_s = now - shift_at;
    if (now >= o.seconds) break;
  }
  stop = true;
  for (auto& w : workers) w.join();
  auto mean_over = [&](double from, double to, double Sample::*f) {
    double sum = 0;
    int n = 0;
    for (const Sample& s : r.samples)
      if (s.t >= from && s.t < to) {
        sum += s.*f;
        ++n;
      }
    return n ? sum / n : 0;
  };
  r.hot_fast_phase1 = mean_over(shift_at - 1, shift_at, &Sample::hot_fast);
  r.hot_fast_phase2 = mean_over(o.seconds - 1, o.seconds + 1, &Sample::hot_fast);
  r.model_phase2 = mean_over(o.seconds - 1, o.seconds + 1, &Sample::model_rel);
  r.updates_mean = mean_over(0.5, o.seconds + 1, &Sample::updates);
  char* js = nullptr;
  if (cxlpool_tiering_stats_json(&js) == CXLPOOL_OK) {
    std::string j = js;
    cxlpool_string_free(js);
    r.moved_bytes = std::stoull(number_after(j, "promote_bytes")) + std::stoull(number_after(j, "demote_bytes"));
    if (std::getenv("TIERING_BENCH_DEBUG")) std::fprintf(stderr, "%s\n", j.c_str());
  }
  return r;
}

void write_result(FILE* f, const Result& r) {
  std::fprintf(f, "R %s %d %.3f %.4f %.4f %.4f %.1f %llu\n", r.placement.c_str(), r.hot_percent, r.converge_s,
               r.hot_fast_phase1, r.hot_fast_phase2, r.model_phase2, r.updates_mean, (unsigned long long)r.moved_bytes);
  for (const Sample& s : r.samples)
    std::fprintf(f, "S %.3f %.4f %.4f %.1f %.4f\n", s.t, s.hot_fast, s.served, s.updates, s.model_rel);
  if (!r.error.empty()) std::fprintf(f, "E %s\n", r.error.c_str());
}

Result read_result(FILE* f) {
  Result r;
  char line[1024];
  while (std::fgets(line, sizeof line, f)) {
    if (line[0] == 'R') {
      char name[64];
      unsigned long long moved = 0;
      std::sscanf(line, "R %63s %d %lf %lf %lf %lf %lf %llu", name, &r.hot_percent, &r.converge_s, &r.hot_fast_phase1,
                  &r.hot_fast_phase2, &r.model_phase2, &r.updates_mean, &moved);
      r.placement = name;
      r.moved_bytes = moved;
    } else if (line[0] == 'S') {
      Sample s{};
      std::sscanf(line, "S %lf %lf %lf %lf %lf", &s.t, &s.hot_fast, &s.served, &s.updates, &s.model_rel);
      r.samples.push_back(s);
    } else if (line[0] == 'E') {
      r.error = std::string(line + 2);
      if (!r.error.empty() && r.error.back() == '\n') r.error.pop_back();
    }
  }
  return r;
}

// Each configuration in a child process: engine state and region sizes start fresh.
Result run_forked(const Options& o, const std::string& placement, int hot) {
  int fds[2];
  if (pipe(fds) != 0) return Result{placement, hot, {}, -1, 0, 0, 0, 0, 0, "pipe failed"};
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    FILE* f = fdopen(fds[1], "w");
    write_result(f, run_one(o, placement, hot));
    std::fclose(f);
    _exit(0);
  }
  close(fds[1]);
  FILE* f = fdopen(fds[0], "r");
  Result r = read_result(f);
  std::fclose(f);
  int status = 0;
  waitpid(pid, &status, 0);
  if (r.placement.empty()) {
    r.placement = placement;
    r.hot_percent = hot;
    r.error = "the run died (status " + std::to_string(status) + ")";
  }
  return r;
}

// The time series behind the plot, as text: for every run, the hot set's share on the fast tier
// and the modelled throughput at each step (the sample at or just after it).
void print_series(const std::vector<Result>& results, const Options& o) {
  std::vector<const Result*> runs;
  for (const Result& r : results)
    if (r.error.empty() && !r.samples.empty()) runs.push_back(&r);
  if (runs.empty()) return;
  std::printf("\nhot set on the fast tier over time (the hot set shifts at %.1f s; model x fast in brackets)\n",
              o.seconds / 2);
  std::printf("%7s", "t s");
  for (const Result* r : runs) {
    const std::string title = r->placement + " " + std::to_string(r->hot_percent) + "%";
    std::printf("  %20s", title.c_str());
  }
  std::printf("\n");
  const int steps = int(o.seconds / o.series + 1e-9);
  for (int k = 1; k <= steps; ++k) {
    const double t = k * o.series;
    std::printf("%7.1f", t);
    for (const Result* r : runs) {
      const Sample* at = &r->samples.back();
      for (const Sample& s : r->samples)
        if (s.t >= t - 0.05) {
          at = &s;
          break;
        }
      std::printf("  %11.0f%% (%.2fx)", 100 * at->hot_fast, at->model_rel);
    }
    std::printf("\n");
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "tiering_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--seconds")
      o.seconds = std::atof(next().c_str());
    else if (a == "--footprint-mib")
      o.footprint = size_t(std::atol(next().c_str())) * kMiB;
    else if (a == "--threads")
      o.threads = std::atoi(next().c_str());
    else if (a == "--json")
      o.json = next();
    else if (a == "--plot")
      o.plot = next();
    else if (a == "--series")
      o.series = std::atof(next().c_str());
    else if (a == "--repeat")
      o.repeat = std::max(1, std::atoi(next().c_str()));
    else if (a == "--hot-share")
      o.hot_share = std::clamp(std::atoi(next().c_str()), 1, 100);
    else if (a == "--tiering")
      o.tiering = next();
    else if (a == "--placements") {
      o.placements.clear();
      std::string v = next();
      for (size_t s = 0, e; s <= v.size(); s = e + 1) {
        e = v.find(',', s);
        if (e == std::string::npos) e = v.size();
        o.placements.push_back(v.substr(s, e - s));
      }
    } else if (a == "--hot") {
      o.hot_percents.clear();
      std::string v = next();
      for (size_t s = 0, e; s <= v.size(); s = e + 1) {
        e = v.find(',', s);
        if (e == std::string::npos) e = v.size();
        o.hot_percents.push_back(std::atoi(v.substr(s, e - s).c_str()));
      }
    } else {
      std::fprintf(stderr,
                   "usage: tiering_bench [--seconds S] [--footprint-mib N] [--threads T] [--hot 10,25] "
                   "[--placements static,interleave,interleave-bw,oracle,cxlpool,monitor-only] [--tiering SPEC] "
                   "[--repeat N] [--hot-share PERCENT] [--series SECONDS] [--json FILE] [--plot FILE.png]\n");
      return 2;
    }
  }
  if (o.seconds < 2 || o.footprint < 64 * kMiB || o.threads < 1) {
    std::fprintf(stderr, "tiering_bench: --seconds >= 2, --footprint-mib >= 64, --threads >= 1\n");
    return 2;
  }
  std::printf(
      "tiering_bench: footprint %zu MiB, fast tier %zu MiB (25%%), %d thread(s), %.0f s per run, hot set shifts "
      "at %.0f s; %d%% of updates go to the hot set, the rest uniformly anywhere\n",
      o.footprint / kMiB, o.footprint / 4 / kMiB, o.threads, o.seconds, o.seconds / 2, o.hot_share);
  std::printf(
      "model: per-access latency fast %.0f ns, slow %.0f ns (declared); model throughput = fast latency / "
      "mean latency, i.e. relative to everything on the fast tier\n\n",
      o.fast_latency_ns, o.slow_latency_ns);
  std::vector<Result> results;
  for (int hot : o.hot_percents)
    for (int rep = 0; rep < o.repeat; ++rep)
      for (const std::string& pl : o.placements) {
        results.push_back(run_forked(o, pl, hot));
        const Result& r = results.back();
        if (!r.error.empty()) std::printf("%-14s hot %2d%%: error: %s\n", pl.c_str(), hot, r.error.c_str());
      }
  std::printf("%-14s %4s %14s %14s %12s %14s %14s %12s\n", "placement", "hot", "hot@fast ph1", "hot@fast ph2",
              "converge s", "model x fast", "updates/s", "moved MiB");
  for (const Result& r : results) {
    if (!r.error.empty()) continue;
    char conv[32];
    if (r.converge_s >= 0)
      std::snprintf(conv, sizeof conv, "%.1f", r.converge_s);
    else
      std::snprintf(conv, sizeof conv, "never");
    std::printf("%-14s %3d%% %13.1f%% %13.1f%% %12s %13.2fx %14.3g %12.0f\n", r.placement.c_str(), r.hot_percent,
                100 * r.hot_fast_phase1, 100 * r.hot_fast_phase2, conv, r.model_phase2, r.updates_mean,
                double(r.moved_bytes) / double(kMiB));
  }
  if (o.series > 0) print_series(results, o);
  // Monitor overhead: the median update rate of the monitor-only runs against the median of
  // the static runs of the same hot set (runs interleaved with --repeat, so drift hits both).
  auto median_rate = [&](const std::string& pl, int hot, int* n) {
    std::vector<double> v;
    for (const Result& r : results)
      if (r.error.empty() && r.placement == pl && r.hot_percent == hot) v.push_back(r.updates_mean);
    *n = int(v.size());
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  std::vector<std::pair<int, double>> overheads;
  for (int hot : o.hot_percents) {
    int ns = 0, nm = 0;
    const double st = median_rate("static", hot, &ns), mo = median_rate("monitor-only", hot, &nm);
    if (st <= 0 || mo <= 0) continue;
    overheads.push_back({hot, 1 - mo / st});
    std::printf(
        "monitor overhead, hot %d%%: %.1f%% (median of %d monitor-only runs %.3g/s vs median of %d static "
        "runs %.3g/s)\n",
        hot, 100 * (1 - mo / st), nm, mo, ns, st);
  }
  if (!o.json.empty()) {
    FILE* f = open_bench_output(o.json);
    if (!f) return 1;
    std::fprintf(f, "{\"footprint_bytes\":%zu,\"fast_bytes\":%zu,\"threads\":%d,\"seconds\":%.1f,", o.footprint,
                 o.footprint / 4, o.threads, o.seconds);
    std::fprintf(f, "\"hot_share_percent\":%d,\"monitor_overhead\":{", o.hot_share);
    for (size_t i = 0; i < overheads.size(); ++i)
      std::fprintf(f, "%s\"%d\":%.4f", i ? "," : "", overheads[i].first, overheads[i].second);
    std::fprintf(f, "},");
    std::fprintf(f, "\"model\":{\"label\":\"model\",\"fast_latency_ns\":%.0f,\"slow_latency_ns\":%.0f},\"runs\":[",
                 o.fast_latency_ns, o.slow_latency_ns);
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      std::fprintf(f,
                   "%s{\"placement\":\"%s\",\"hot_percent\":%d,\"error\":\"%s\",\"converge_s\":%.3f,"
                   "\"hot_fast_phase1\":%.4f,\"hot_fast_phase2\":%.4f,\"model_relative_throughput_phase2\":%.4f,"
                   "\"updates_per_s\":%.1f,\"moved_bytes\":%llu,\"samples\":[",
                   i ? "," : "", r.placement.c_str(), r.hot_percent, r.error.empty() ? "" : "failed", r.converge_s,
                   r.hot_fast_phase1, r.hot_fast_phase2, r.model_phase2, r.updates_mean,
                   (unsigned long long)r.moved_bytes);
      for (size_t k = 0; k < r.samples.size(); ++k) {
        const Sample& s = r.samples[k];
        std::fprintf(f, "%s[%.2f,%.4f,%.4f,%.1f,%.4f]", k ? "," : "", s.t, s.hot_fast, s.served, s.updates,
                     s.model_rel);
      }
      std::fprintf(f, "]}");
    }
    std::fprintf(f, "],\"sample_fields\":[\"t_s\",\"hot_fast\",\"served_fast\",\"updates_per_s\",\"model_rel\"]}\n");
    std::fclose(f);
    std::printf("\nJSON: %s\n", o.json.c_str());
  }
  if (!o.plot.empty()) {
    std::string dat = o.plot + ".dat", gp = o.plot + ".gp";
    FILE* d = open_bench_output(dat);
    if (!d) return 1;
    std::vector<std::string> titles;
    for (const Result& r : results) {
      if (!r.error.empty() || r.placement == "monitor-only") continue;
      const std::string title = r.placement + " (hot " + std::to_string(r.hot_percent) + "%)";
      if (std::find(titles.begin(), titles.end(), title) != titles.end()) continue;  // the first of --repeat runs
      for (const Sample& s : r.samples) std::fprintf(d, "%.2f %.4f\n", s.t, 100 * s.hot_fast);
      std::fprintf(d, "\n\n");
      titles.push_back(title);
    }
    std::fclose(d);
    FILE* g = open_bench_output(gp);
    if (!g) return 1;
    std::fprintf(
        g,
        "set terminal pngcairo size 1100,600\nset output '%s'\nset xlabel 'time (s); the hot set shifts at "
        "%.0f s'\nset ylabel 'hot-set bytes on the fast tier (%%)'\nset yrange [0:105]\nset key outside right\n"
        "set title 'bench/tiering: GUPS-like, footprint %zu MiB, fast tier 25%%'\nplot ",
        o.plot.c_str(), o.seconds / 2, o.footprint / kMiB);
    for (size_t i = 0; i < titles.size(); ++i)
      std::fprintf(g, "%s'%s' index %zu with lines lw 2 title '%s'", i ? ", " : "", dat.c_str(), i, titles[i].c_str());
    std::fprintf(g, "\n");
    std::fclose(g);
    std::string cmd = "gnuplot '" + gp + "'";
    if (std::system(cmd.c_str()) != 0)
      std::printf(
          "plot: gnuplot failed or is missing (bash scripts/install-deps.sh installs gnuplot-nox); data in %s\n",
          dat.c_str());
    else
      std::printf("plot: %s\n", o.plot.c_str());
  }
  return 0;
}
