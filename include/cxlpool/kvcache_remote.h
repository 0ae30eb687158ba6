/* SPDX-License-Identifier: MIT */
/* KV cache handoff between processes that do not share a pool (other hosts): libcxlpool_ucx.
 *
 * The producer runs a server next to its arena: consumers connect and send a
 * cxlpool_kv_handle_t; the server validates it as cxlpool_kv_import does and sends the
 * sequence's blocks, each as a UCX active message that lands directly in blocks the consumer
 * allocated in its own pool (UCX rendezvous: zero-copy RDMA on verbs, CMA or shared memory on
 * one host, the tcp transport elsewhere). The consumer gets an ordinary view
 * (cxlpool_kv_view_block / _info / _release), as from cxlpool_kv_import.
 *
 * Trust: a consumer receives only the blocks of handles the server validated; it never names
 * an address in the producer (the server's UCX worker has no RMA feature: UCX's software RMA
 * over tcp would let any peer read any address). A handle's checks are not secret: a consumer
 * that can forge handles can fetch any live block of the server's pools.
 *
 * UCX picks its transports from its own environment (UCX_TLS, UCX_NET_DEVICES, ...): see
 * docs/kvcache.md. Link with -lcxlpool_ucx -lcxlpool (CMake: cxlpool::cxlpool_ucx); errors are
 * recorded as cxlpool_last_error() like every other cxlpool call. Servers and connections
 * belong to the process that made them: in a fork child every call on them is refused
 * (CXLPOOL_E_NOT_SUPPORTED) and nothing of the parent's is touched. */
#ifndef CXLPOOL_KVCACHE_REMOTE_H
#define CXLPOOL_KVCACHE_REMOTE_H

#include "cxlpool/kvcache.h"

#ifdef __cplusplus
extern "C" {
#endif

/* CXLPOOL_KV_REMOTE_SAME_HOST, given to the server and to the consumer's connection: when both
 * ask for it and UCX reaches the consumer through shared memory (UCX's sysv or posix transport
 * for the messages, CMA for the blocks when UCX_TLS allows it), the blocks go that way instead
 * of through the socket the connection was made on; cxlpool_kv_remote_path says which way a
 * connection goes, and why. Only between processes of one user: UCX's shared-memory transports
 * trust the peer completely (the server maps and writes what the consumer's worker address
 * names, with the server's rights, and a malformed address aborts UCX), so the server offers
 * the path only to a consumer that proves it may read the server's memory (it reads a random
 * nonce there with process_vm_readv: the ptrace permission the kernel checks), over a direct
 * connection (the process named must hold the server's end of it): a process that could
 * already do all of that to the server. Others are told why (PERMISSION in the path's text)
 * and served over the connection's own transport, as are consumers on other hosts or
 * namespaces and servers without the flag. */
#define CXLPOOL_KV_REMOTE_SAME_HOST 1u

/* A producer's server: serves the exports (cxlpool_kv_seq_export) whose blocks are in pools.
 * address: "IPV4:PORT" or "HOSTNAME:PORT" to listen on (port 0: any free port, see
 * cxlpool_kv_server_address; IPv6 is refused: UCX 1.13's tcp connection manager corrupts its
 * heap on an IPv6 peer). While a sequence is being sent the server holds a lease on every block
 * (the producer may destroy the sequence meanwhile); the leases go when its last block is sent,
 * when the consumer gives up, fails or disconnects, when it does not ask for the blocks within
 * 10 s, or when no block has reached it for 10 s (its connection is then closed). At most 64 sequences are handed out
 * at once (16 per consumer): more are CXLPOOL_E_BUSY for the consumer. The pools must stay open until the server is
 * stopped. flags: 0 or CXLPOOL_KV_REMOTE_SAME_HOST (below). Statuses: INVALID_ARGUMENT (the address, naming the bad
 * part; an unknown flag), NOT_SUPPORTED (IPv6), OS (UCX refused: its message is included). */
typedef struct cxlpool_kv_server cxlpool_kv_server_t;
CXLPOOL_API cxlpool_status_t cxlpool_kv_server_start(cxlpool_shared_pool_t* const* pools, size_t npools,
                                                     const char* address, uint32_t flags, cxlpool_kv_server_t** out);
/* The address the server listens on, "IP:PORT" (the port it got when asked for 0). */
CXLPOOL_API cxlpool_status_t cxlpool_kv_server_address(const cxlpool_kv_server_t* server, char* buf, size_t len);
typedef struct cxlpool_kv_server_counters {
  uint64_t connections;   /* consumers accepted */
  uint64_t disconnects;   /* consumers gone (closed, or failed: their leases were dropped) */
  uint64_t fetches;       /* sequences handed out */
  uint64_t refused;       /* requests refused (the import's status went back to the consumer) */
  uint64_t bytes_offered; /* bytes of the blocks handed out */
  uint64_t views_held;    /* sequences being handed out now (their blocks leased) */
  uint64_t expired;       /* sequences a consumer asked for and never pulled within 10 s */
  uint64_t same_host;     /* consumers served through shared memory (CXLPOOL_KV_REMOTE_SAME_HOST) */
  uint64_t reserved[4];
} cxlpool_kv_server_stats_t;
CXLPOOL_API cxlpool_status_t cxlpool_kv_server_stats(const cxlpool_kv_server_t* server, cxlpool_kv_server_stats_t* out);
/* Disconnects every consumer, drops every lease, and frees the server. */
CXLPOOL_API cxlpool_status_t cxlpool_kv_server_stop(cxlpool_kv_server_t* server);

/* A consumer's connection to one server. timeout_ms bounds connecting, and each import as a
 * whole (0: 10,000 ms). flags: 0 or CXLPOOL_KV_REMOTE_SAME_HOST (above). Statuses:
 * INVALID_ARGUMENT (the address; an unknown flag), OS (no connection: UCX's reason; or the
 * same-host path the server offered did not come up within the timeout). */
typedef struct cxlpool_kv_remote cxlpool_kv_remote_t;
CXLPOOL_API cxlpool_status_t cxlpool_kv_remote_connect(const char* address, uint32_t timeout_ms, uint32_t flags,
                                                       cxlpool_kv_remote_t** out);
/* Which way the connection's blocks go, as text: "same host: am sysv/memory, rma_bw
 * cma/memory" or "network: am tcp/lo (...why not the same host...)". */
CXLPOOL_API cxlpool_status_t cxlpool_kv_remote_path(const cxlpool_kv_remote_t* remote, char* buf, size_t len);
/* Fetches the exported sequence `handle` names from the server into blocks allocated in this
 * process's pools (cxlpool_kv_view_create) and returns them as a view. expected (may be NULL)
 * must equal the exporter's geometry. The server validates the handle exactly as
 * cxlpool_kv_import does and its refusal comes back with its status and message; what the
 * server says is validated here (sizes, counts, every block once and whole) before anything is
 * allocated. A connection that failed (server gone, timeout, a reply that breaks the protocol)
 * stays failed: CXLPOOL_E_DEVICE_FAILED; close it and connect again. */
CXLPOOL_API cxlpool_status_t cxlpool_kv_remote_import(cxlpool_kv_remote_t* remote, cxlpool_shared_pool_t* const* pools,
                                                      size_t npools, const cxlpool_kv_geometry_t* expected,
                                                      const cxlpool_kv_handle_t* handle, cxlpool_kv_view_t** out);
CXLPOOL_API cxlpool_status_t cxlpool_kv_remote_close(cxlpool_kv_remote_t* remote);

#ifdef __cplusplus
}
#endif

#endif /* CXLPOOL_KVCACHE_REMOTE_H */
