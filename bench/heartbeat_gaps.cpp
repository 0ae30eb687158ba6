// SPDX-License-Identifier: MIT
// The gaps between a shared-pool participant's own heartbeats (docs/shared.md, "Liveness"):
// what a machine does to a thread that sleeps one heartbeat period. Creates a pool, joins it
// from --participants processes, each idle or calling the pool in a loop (--busy), for
// --seconds, then prints each participant's beats, largest gap and quantiles as the library
// records them (cxlpool_shared_pool_stats_json, "heartbeat"). Saturate the CPUs around it, e.g.
//   stress-ng --cpu 8 --timeout 330s & build/bench/heartbeat_gaps --seconds 300
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cxlpool/cxlpool.h"

namespace {

// The "heartbeat" object of the participant's statistics.
std::string heartbeat_of(cxlpool_shared_pool_t* pool) {
  char* json = nullptr;
  if (cxlpool_shared_pool_stats_json(pool, &json) != CXLPOOL_OK) return "?";
  std::string s = json;
  cxlpool_string_free(json);
  const size_t at = s.find("\"heartbeat\": {");
  if (at == std::string::npos) return "?";
  std::string out;
  for (char c : s.substr(at + 13, s.find('}', at) - at - 12))
    if (c != '\n' && !(c == ' ' && (out.empty() || out.back() == ' ' || out.back() == '{'))) out += c;
  return out;
}

int participate(const std::string& device, double seconds, bool busy, int index) {
  cxlpool_shared_pool_t* pool = nullptr;
  if (cxlpool_shared_pool_open(device.c_str(), nullptr, &pool) != CXLPOOL_OK) {
    std::fprintf(stderr, "heartbeat_gaps: open: %s\n", cxlpool_last_error_message());
    return 1;
  }
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  uint64_t calls = 0;
  while (std::chrono::steady_clock::now() < end) {
    if (!busy) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    void* p = nullptr;
    if (cxlpool_shared_alloc(pool, 128 + (calls % 32) * 256, &p) == CXLPOOL_OK) cxlpool_shared_free(pool, p);
    ++calls;
  }
  cxlpool_shared_info_t info{};
  cxlpool_shared_pool_info(pool, &info);
  std::printf("participant %d (pid %d, %s): %s, recovered others %llu\n", index, getpid(), busy ? "busy" : "idle",
              heartbeat_of(pool).c_str(), static_cast<unsigned long long>(info.recovered_slots));
  std::fflush(stdout);
  return cxlpool_shared_pool_close(pool) == CXLPOOL_OK ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 60;
  int participants = 2;
  bool busy = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--seconds" && i + 1 < argc)
      seconds = std::atof(argv[++i]);
    else if (a == "--participants" && i + 1 < argc)
      participants = std::atoi(argv[++i]);
    else if (a == "--busy")
      busy = true;
    else {
      std::fprintf(stderr, "usage: heartbeat_gaps [--seconds S] [--participants N] [--busy]\n");
      return 2;
    }
  }
  const std::string device = "shm:cxlpool-heartbeat-gaps-" + std::to_string(getpid());
  cxlpool_shared_params_t* params = nullptr;
  cxlpool_shared_params_create(&params);
  cxlpool_shared_params_set_size(params, 64u << 20);
  cxlpool_shared_pool_t* pool = nullptr;
  const cxlpool_status_t st = cxlpool_shared_pool_create(device.c_str(), params, 0, &pool);
  cxlpool_shared_params_destroy(params);
  if (st != CXLPOOL_OK) {
    std::fprintf(stderr, "heartbeat_gaps: create: %s\n", cxlpool_last_error_message());
    return 1;
  }
  cxlpool_shared_pool_close(pool);  // the participants are the children; none forks from one
  std::printf("heartbeat_gaps: %d participants, %s, %.0f s, default timing (heartbeat 10 ms)\n", participants,
              busy ? "busy" : "idle", seconds);
  std::fflush(stdout);
  std::vector<pid_t> pids;
  for (int k = 0; k < participants; ++k) {
    const pid_t pid = fork();
    if (pid == 0) _exit(participate(device, seconds, busy, k));
    pids.push_back(pid);
  }
  int failures = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    failures += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  cxlpool_shared_pool_unlink(device.c_str());
  return failures ? 1 : 0;
}
