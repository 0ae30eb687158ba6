/* SPDX-License-Identifier: MIT */
/* Both ends of the KV cache handoff between hosts (libcxlpool_ucx), C, public API only; driven
 * line by line by tests/unit/kv_remote_test.py (which may run each end in its own network
 * namespace):
 *   kv_remote_peer produce DEVICE ADDR   a shared pool DEVICE, an arena and a KV server on ADDR;
 *     prints "listening ADDR" ("same-host" after ADDR: CXLPOOL_KV_REMOTE_SAME_HOST, both modes). "S TOKENS SEED": a
 * sequence of TOKENS tokens with bytes from SEED, exported: "H HEX CHECKSUM" (the previous sequence is destroyed
 * first); "X": destroy it ("destroyed"); "L": "stats VIEWS FETCHES REFUSED DISCONNECTS LEASES SAME_HOST"; "Q": stop.
 *   kv_remote_peer consume DEVICE ADDR   its own pool DEVICE and a connection to ADDR ("connected
 *     PATH", the connection's cxlpool_kv_remote_path). "H HEX
 *     CHECKSUM": import, check the checksum of every block's bytes, release: "ok" or "bad STATUS
 *     MESSAGE"; "F HEX": import expecting a refusal: "status STATUS MESSAGE"; "K HEX": import
 *     and hold the view ("held"); "Q": close.
 *   kv_remote_peer selftest              argument checks of the API; prints what failed.
 *   kv_remote_peer pair IP COUNT         both ends by itself, for a guest without a driver
 *     script (the Soft-RoCE run, tests/vm): forks a producer listening on IP:0, then COUNT
 *     handoffs of 1..400 tokens and one of 2048, checksums compared; prints "connected PATH" and
 *     "pair: N handoffs, B bad"; exit 0 when none is bad. UCX's environment picks the transport. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cxlpool/cxlpool.h"
#include "cxlpool/kvcache_remote.h"
#include "kv_hex.h"

static cxlpool_kv_geometry_t test_geometry(void) {
  cxlpool_kv_geometry_t g;
  memset(&g, 0, sizeof g);
  g.layers = 2;
  g.kv_heads = 2;
  g.head_dim = 64;
  g.dtype = CXLPOOL_KV_FP16;
  g.tokens_per_block = 16; /* 1 KiB per token, 16 KiB per block */
  return g;
}

static cxlpool_shared_pool_t* make_pool(const char* device) {
  cxlpool_shared_params_t* params = NULL;
  cxlpool_shared_pool_t* pool = NULL;
  cxlpool_shared_pool_unlink(device);
  if (cxlpool_shared_params_create(&params) != CXLPOOL_OK ||
      cxlpool_shared_params_set_size(params, 256ull << 20) != CXLPOOL_OK ||
      cxlpool_shared_pool_create(device, params, 0, &pool) != CXLPOOL_OK) {
    printf("bad pool %s\n", cxlpool_last_error_message());
    exit(3);
  }
  cxlpool_shared_params_destroy(params);
  return pool;
}

/* Checksum of every block of a view, in order. */
static uint64_t view_checksum(const cxlpool_kv_view_t* view) {
  cxlpool_kv_view_info_t info;
  uint64_t h = 0xcbf29ce484222325ull;
  if (cxlpool_kv_view_info(view, &info) != CXLPOOL_OK) return 0;
  for (uint64_t i = 0; i < info.blocks; ++i) {
    const void* data = NULL;
    if (cxlpool_kv_view_block(view, i, &data) != CXLPOOL_OK) return 0;
    h = fnv(data, info.bytes_per_block, h);
  }
  return h ^ info.tokens;
}

static int produce(const char* device, const char* address, uint32_t flags) {
  cxlpool_shared_pool_t* pool = make_pool(device);
  cxlpool_kv_geometry_t g = test_geometry();
  cxlpool_kv_arena_t* arena = NULL;
  cxlpool_kv_server_t* server = NULL;
  if (cxlpool_kv_arena_create(&g, &pool, 1, NULL, &arena) != CXLPOOL_OK ||
      cxlpool_kv_server_start(&pool, 1, address, flags, &server) != CXLPOOL_OK) {
    printf("bad start %s\n", cxlpool_last_error_message());
    return 4;
  }
  char actual[128];
  cxlpool_kv_server_address(server, actual, sizeof actual);
  printf("listening %s\n", actual);
  cxlpool_kv_seq_t* seq = NULL;
  char line[256];
  while (fgets(line, sizeof line, stdin)) {
    unsigned long long tokens = 0, seed = 0;
    if (sscanf(line, "S %llu %llu", &tokens, &seed) == 2) {
      if (seq) cxlpool_kv_seq_destroy(seq);
      seq = NULL;
      int32_t* ids = malloc(tokens * sizeof *ids);
      for (unsigned long long i = 0; i < tokens; ++i) ids[i] = (int32_t)((seed * 7919 + i) % 50000);
      uint64_t reused = 0;
      cxlpool_kv_handle_t h;
      cxlpool_kv_seq_info_t si;
      if (cxlpool_kv_seq_create(arena, &seq) != CXLPOOL_OK ||
          cxlpool_kv_seq_append(seq, ids, tokens, &reused) != CXLPOOL_OK ||
          cxlpool_kv_seq_info(seq, &si) != CXLPOOL_OK) {
        printf("bad seq %s\n", cxlpool_last_error_message());
        free(ids);
        continue;
      }
      free(ids);
      uint64_t bpt = 0, bpb = 0;
      cxlpool_kv_geometry_sizes(&g, &bpt, &bpb);
      for (uint64_t b = reused / g.tokens_per_block; b < si.blocks; ++b) { /* shared blocks are sealed */
        void* data = NULL;
        cxlpool_kv_seq_block(seq, b, &data, NULL);
        uint64_t x = seed * 0x9e3779b97f4a7c15ull + b;
        for (uint64_t off = 0; off < bpb; off += 8) {
          x ^= x << 13, x ^= x >> 7, x ^= x << 17;
          memcpy((char*)data + off, &x, 8);
        }
      }
      if (cxlpool_kv_seq_seal(seq, tokens) != CXLPOOL_OK || cxlpool_kv_seq_export(seq, 0, &h) != CXLPOOL_OK) {
        printf("bad export %s\n", cxlpool_last_error_message());
        continue;
      }
      /* The checksum the consumer must find: computed through a local import of the export. */
      cxlpool_kv_view_t* view = NULL;
      if (cxlpool_kv_import(&pool, 1, &g, &h, &view) != CXLPOOL_OK) {
        printf("bad import %s\n", cxlpool_last_error_message());
        continue;
      }
      char hex[2 * sizeof h + 1];
      to_hex(&h, sizeof h, hex);
      printf("H %s %016" PRIx64 "\n", hex, view_checksum(view));
      cxlpool_kv_view_release(view);
    } else if (line[0] == 'X') {
      if (seq) cxlpool_kv_seq_destroy(seq);
      seq = NULL;
      printf("destroyed\n");
    } else if (line[0] == 'L') {
      cxlpool_kv_server_stats_t st;
      cxlpool_shared_info_t info;
      cxlpool_kv_server_stats(server, &st);
      cxlpool_shared_pool_info(pool, &info);
      printf("stats %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %u %" PRIu64 "\n", st.views_held, st.fetches,
             st.refused, st.disconnects, info.leases_held, st.same_host);
    } else if (line[0] == 'Q') {
      break;
    }
  }
  if (seq) cxlpool_kv_seq_destroy(seq);
  if (cxlpool_kv_server_stop(server) != CXLPOOL_OK) printf("bad stop %s\n", cxlpool_last_error_message());
  cxlpool_kv_arena_destroy(arena);
  cxlpool_shared_pool_close(pool);
  cxlpool_shared_pool_unlink(device);
  printf("bye\n");
  return 0;
}

static int consume(const char* device, const char* address, uint32_t flags) {
  cxlpool_shared_pool_t* pool = make_pool(device);
  cxlpool_kv_remote_t* remote = NULL;
  char path[512];
  if (cxlpool_kv_remote_connect(address, 10000, flags, &remote) != CXLPOOL_OK ||
      cxlpool_kv_remote_path(remote, path, sizeof path) != CXLPOOL_OK) {
    printf("bad connect %s\n", cxlpool_last_error_message());
    return 4;
  }
  printf("connected %s\n", path);
  cxlpool_kv_geometry_t g = test_geometry();
  char line[512], hex[256];
  cxlpool_kv_view_t* held[64];
  int nheld = 0;
  while (fgets(line, sizeof line, stdin)) {
    cxlpool_kv_handle_t h;
    uint64_t want = 0;
    char kind = line[0];
    if (kind == 'Q') break;
    if (sscanf(line + 1, "%255s %" SCNx64, hex, &want) < 1 || from_hex(hex, &h, sizeof h)) {
      printf("bad line\n");
      continue;
    }
    cxlpool_kv_view_t* view = NULL;
    cxlpool_status_t s = cxlpool_kv_remote_import(remote, &pool, 1, &g, &h, &view);
    if (kind == 'F') {
      printf("status %d %s\n", (int)s, s == CXLPOOL_OK ? "" : cxlpool_last_error_message());
      if (s == CXLPOOL_OK) cxlpool_kv_view_release(view);
      continue;
    }
    if (s != CXLPOOL_OK) {
      printf("bad %d %s\n", (int)s, cxlpool_last_error_message());
      continue;
    }
    if (kind == 'K' && nheld < 64) {
      held[nheld++] = view;
      printf("held\n");
      continue;
    }
    uint64_t got = view_checksum(view);
    cxlpool_kv_view_release(view);
    if (got == want)
      printf("ok\n");
    else
      printf("bad checksum %016" PRIx64 " expected %016" PRIx64 "\n", got, want);
  }
  for (int i = 0; i < nheld; ++i) cxlpool_kv_view_release(held[i]);
  cxlpool_kv_remote_close(remote);
  cxlpool_shared_pool_close(pool);
  cxlpool_shared_pool_unlink(device);
  printf("bye\n");
  return 0;
}

static int failures = 0;
static void expect(int ok, const char* what) {
  if (!ok) {
    printf("FAILED: %s (last error: %s)\n", what, cxlpool_last_error_message());
    ++failures;
  }
}
static int message_has(const char* needle) { return strstr(cxlpool_last_error_message(), needle) != NULL; }

static int selftest(void) {
  cxlpool_kv_remote_t* r = NULL;
  cxlpool_kv_server_t* s = NULL;
  expect(cxlpool_kv_remote_connect(NULL, 0, 0, &r) == CXLPOOL_E_INVALID_ARGUMENT && message_has("NULL"),
         "NULL address");
  const char* bad[] = {"",      "127.0.0.1", "127.0.0.1:", "127.0.0.1:http",           "127.0.0.1:70000", "127.0.0.1:0",
                       ":5000", "::1:5000",  "[::1]5000",  "no-such-host.invalid:5000"};
  const char* named[] = {"empty",   "no port",  "port \"\"",   "port \"http\"",       "above 65535", "0 only to listen",
                         "no host", "brackets", "[IPV6]:PORT", "no-such-host.invalid"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; ++i) {
    cxlpool_status_t st = cxlpool_kv_remote_connect(bad[i], 0, 0, &r);
    char what[128];
    snprintf(what, sizeof what, "address \"%s\" refused naming \"%s\"", bad[i], named[i]);
    expect(st == CXLPOOL_E_INVALID_ARGUMENT && message_has(named[i]) && r == NULL, what);
  }
  expect(cxlpool_kv_remote_connect("127.0.0.1:5000", 0, 0, NULL) == CXLPOOL_E_INVALID_ARGUMENT, "NULL out");
  expect(cxlpool_kv_remote_connect("[::1]:5000", 0, 0, &r) == CXLPOOL_E_NOT_SUPPORTED && message_has("IPv6"),
         "IPv6 refused, saying why");
  /* Nobody listens on port 9 (discard) here: a clear OS error within the timeout, not a hang. */
  cxlpool_status_t st = cxlpool_kv_remote_connect("127.0.0.1:9", 2000, 0, &r);
  expect(st == CXLPOOL_E_OS && message_has("no connection to 127.0.0.1:9") && r == NULL, "nobody listening");
  expect(cxlpool_kv_remote_connect("127.0.0.1:5000", 0, 6, &r) == CXLPOOL_E_INVALID_ARGUMENT &&
             message_has("unknown flags"),
         "unknown connect flags");
  expect(cxlpool_kv_server_start(NULL, 0, "127.0.0.1:0", 0, &s) == CXLPOOL_E_INVALID_ARGUMENT, "no pools");
  expect(cxlpool_kv_server_start(NULL, 1, "127.0.0.1", 0, &s) == CXLPOOL_E_INVALID_ARGUMENT && message_has("no port"),
         "server address without port");
  expect(cxlpool_kv_remote_path(NULL, NULL, 0) == CXLPOOL_E_INVALID_ARGUMENT, "path of NULL");
  expect(cxlpool_kv_server_stop(NULL) == CXLPOOL_E_INVALID_ARGUMENT, "stop NULL");
  expect(cxlpool_kv_remote_close(NULL) == CXLPOOL_E_INVALID_ARGUMENT, "close NULL");
  expect(cxlpool_kv_remote_import(NULL, NULL, 0, NULL, NULL, NULL) == CXLPOOL_E_INVALID_ARGUMENT, "import NULL");
  int not_a_handle[32] = {0};
  expect(cxlpool_kv_server_stop((cxlpool_kv_server_t*)not_a_handle) == CXLPOOL_E_INVALID_ARGUMENT, "foreign server");
  expect(cxlpool_kv_remote_close((cxlpool_kv_remote_t*)not_a_handle) == CXLPOOL_E_INVALID_ARGUMENT, "foreign remote");
  /* A server, stopped twice: the second is refused. Port 0: it reports the port it got. */
  cxlpool_shared_pool_t* pool = make_pool("shm:cxlpool-kvr-selftest");
  expect(cxlpool_kv_server_start(&pool, 1, "127.0.0.1:0", 0x10, &s) == CXLPOOL_E_INVALID_ARGUMENT &&
             message_has("unknown flags 0x10") && s == NULL,
         "unknown server flags");
  expect(cxlpool_kv_server_start(&pool, 1, "127.0.0.1:0", 0, &s) == CXLPOOL_OK, "server on port 0");
  if (s) {
    char a[64];
    expect(cxlpool_kv_server_address(s, a, 4) == CXLPOOL_E_INVALID_ARGUMENT, "short address buffer");
    expect(cxlpool_kv_server_address(s, a, sizeof a) == CXLPOOL_OK && strncmp(a, "127.0.0.1:", 10) == 0 &&
               strcmp(a, "127.0.0.1:0") != 0,
           "server address has its port");
    /* A second server on the same port: UCX's refusal, named. */
    cxlpool_kv_server_t* s2 = NULL;
    expect(cxlpool_kv_server_start(&pool, 1, a, 0, &s2) == CXLPOOL_E_OS && s2 == NULL, "port taken");
    /* fork after connecting: the child is refused on both handles, touching nothing; the
     * parent's connection still works (a forged handle comes back refused by the server). */
    cxlpool_kv_remote_t* c = NULL;
    /* Asking for the same-host path of a server that does not offer it: connected, over the
     * network, saying why. */
    expect(cxlpool_kv_remote_connect(a, 5000, CXLPOOL_KV_REMOTE_SAME_HOST, &c) == CXLPOOL_OK, "connect same-host");
    if (c) {
      char path[512];
      expect(cxlpool_kv_remote_path(c, path, 4) == CXLPOOL_E_INVALID_ARGUMENT, "short path buffer");
      expect(cxlpool_kv_remote_path(c, path, sizeof path) == CXLPOOL_OK && strncmp(path, "network: ", 9) == 0 &&
                 strstr(path, "does not offer a same-host path"),
             "a server without the same-host flag: the network, saying why");
      cxlpool_kv_remote_close(c);
      c = NULL;
    }
    expect(cxlpool_kv_remote_connect(a, 5000, 0, &c) == CXLPOOL_OK, "connect to the server");
    if (c) {
      cxlpool_kv_handle_t forged;
      memset(&forged, 0x5a, sizeof forged);
      cxlpool_kv_view_t* view = NULL;
      pid_t child = fork();
      if (child == 0) {
        char path[512];
        int ok = cxlpool_kv_remote_import(c, &pool, 1, NULL, &forged, &view) == CXLPOOL_E_NOT_SUPPORTED &&
                 message_has("fork child") && cxlpool_kv_remote_path(c, path, sizeof path) == CXLPOOL_E_NOT_SUPPORTED &&
                 cxlpool_kv_remote_close(c) == CXLPOOL_E_NOT_SUPPORTED &&
                 cxlpool_kv_server_stop(s) == CXLPOOL_E_NOT_SUPPORTED;
        _exit(ok ? 0 : 1);
      }
      int status = 0;
      waitpid(child, &status, 0);
      expect(WIFEXITED(status) && WEXITSTATUS(status) == 0, "a fork child is refused on the parent's handles");
      expect(cxlpool_kv_remote_import(c, &pool, 1, NULL, &forged, &view) == CXLPOOL_E_INVALID_ARGUMENT &&
                 message_has("refused by"),
             "the parent's connection works after the fork");
      expect(cxlpool_kv_remote_close(c) == CXLPOOL_OK, "close");
      expect(cxlpool_kv_remote_close(c) == CXLPOOL_E_INVALID_ARGUMENT, "second close refused");
    }
    expect(cxlpool_kv_server_stop(s) == CXLPOOL_OK, "stop");
    expect(cxlpool_kv_server_stop(s) == CXLPOOL_E_INVALID_ARGUMENT, "second stop refused");
  }
  /* A landing view: writable; an imported one is not. */
  cxlpool_kv_geometry_t g = test_geometry();
  cxlpool_kv_view_t* v = NULL;
  expect(cxlpool_kv_view_create(&pool, 1, &g, 0, &v) == CXLPOOL_E_INVALID_ARGUMENT, "landing view of 0 tokens");
  expect(cxlpool_kv_view_create(&pool, 1, &g, 1u << 20, &v) == CXLPOOL_E_CAPACITY && v == NULL,
         "landing view beyond the pool");
  expect(cxlpool_kv_view_create(&pool, 1, &g, 33, &v) == CXLPOOL_OK, "landing view");
  if (v) {
    void* data = NULL;
    expect(cxlpool_kv_view_block_writable(v, 2, &data) == CXLPOOL_OK && data, "landing block 2");
    expect(cxlpool_kv_view_block_writable(v, 3, &data) == CXLPOOL_E_INVALID_ARGUMENT, "landing block 3 of 3");
    cxlpool_shared_info_t before, after;
    cxlpool_shared_pool_info(pool, &before);
    cxlpool_kv_view_release(v);
    cxlpool_shared_pool_info(pool, &after);
    expect(after.bytes_in_use < before.bytes_in_use, "landing blocks freed at release");
  }
  cxlpool_shared_pool_close(pool);
  cxlpool_shared_pool_unlink("shm:cxlpool-kvr-selftest");
  printf(failures ? "selftest: %d failed\n" : "selftest: ok\n", failures);
  return failures ? 1 : 0;
}

static int pair(const char* ip, int count) {
  int down[2], up[2];
  if (pipe(down) || pipe(up)) return 5;
  char pdev[64], cdev[64], addr[96];
  snprintf(pdev, sizeof pdev, "shm:cxlpool-kvr-pair-p-%d", (int)getpid());
  snprintf(cdev, sizeof cdev, "shm:cxlpool-kvr-pair-c-%d", (int)getpid());
  snprintf(addr, sizeof addr, "%s:0", ip);
  pid_t child = fork(); /* before anything of UCX exists in this process */
  if (child == 0) {
    dup2(down[0], 0);
    dup2(up[1], 1);
    close(down[1]);
    close(up[0]);
    _exit(produce(pdev, addr, 0));
  }
  close(down[0]);
  close(up[1]);
  FILE* to = fdopen(down[1], "w");
  FILE* from = fdopen(up[0], "r");
  setvbuf(to, NULL, _IOLBF, 0);
  char line[512], where[128] = "";
  if (!fgets(line, sizeof line, from) || sscanf(line, "listening %127s", where) != 1) {
    printf("pair: the producer said: %s\n", line);
    return 4;
  }
  cxlpool_shared_pool_t* pool = make_pool(cdev);
  cxlpool_kv_remote_t* remote = NULL;
  char path[512];
  if (cxlpool_kv_remote_connect(where, 30000, 0, &remote) != CXLPOOL_OK ||
      cxlpool_kv_remote_path(remote, path, sizeof path) != CXLPOOL_OK) {
    printf("pair: bad connect %s\n", cxlpool_last_error_message());
    fprintf(to, "Q\n");
    return 4;
  }
  printf("connected %s\n", path);
  cxlpool_kv_geometry_t g = test_geometry();
  uint64_t x = 20261202;
  int bad = 0;
  for (int i = 0; i <= count; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const unsigned tokens = i == count ? 2048 : 1 + (unsigned)((x >> 33) % 400);
    fprintf(to, "S %u %d\n", tokens, i);
    char hex[256];
    uint64_t want = 0;
    cxlpool_kv_handle_t h;
    if (!fgets(line, sizeof line, from) || sscanf(line, "H %255s %" SCNx64, hex, &want) != 2 ||
        from_hex(hex, &h, sizeof h)) {
      printf("pair: the producer said: %s", line);
      ++bad;
      break;
    }
    cxlpool_kv_view_t* view = NULL;
    cxlpool_status_t st = cxlpool_kv_remote_import(remote, &pool, 1, &g, &h, &view);
    if (st != CXLPOOL_OK) {
      if (++bad <= 5) printf("pair: handoff %d (%u tokens): %s\n", i, tokens, cxlpool_last_error_message());
      continue;
    }
    const uint64_t got = view_checksum(view);
    cxlpool_kv_view_release(view);
    if (got != want && ++bad <= 5) printf("pair: handoff %d (%u tokens): checksum differs\n", i, tokens);
  }
  printf("pair: %d handoffs, %d bad\n", count + 1, bad);
  cxlpool_kv_remote_close(remote);
  cxlpool_shared_pool_close(pool);
  cxlpool_shared_pool_unlink(cdev);
  fprintf(to, "Q\n");
  fclose(to);
  int status = 0;
  waitpid(child, &status, 0);
  fclose(from);
  return bad == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc == 4 && strcmp(argv[1], "pair") == 0) return pair(argv[2], atoi(argv[3]));
  if (argc == 2 && strcmp(argv[1], "selftest") == 0) return selftest();
  const uint32_t flags = argc == 5 && strcmp(argv[4], "same-host") == 0 ? CXLPOOL_KV_REMOTE_SAME_HOST : 0;
  if ((argc == 4 || flags) && strcmp(argv[1], "produce") == 0) return produce(argv[2], argv[3], flags);
  if ((argc == 4 || flags) && strcmp(argv[1], "consume") == 0) return consume(argv[2], argv[3], flags);
  fprintf(stderr,
          "usage: kv_remote_peer produce|consume DEVICE ADDR [same-host] | kv_remote_peer selftest | "
          "kv_remote_peer pair IP COUNT\n");
  return 2;
}
