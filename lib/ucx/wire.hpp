// SPDX-License-Identifier: MIT
// The KV remote protocol (libcxlpool_ucx) on the wire: UCX active messages between a consumer
// and a producer's server. FETCH (consumer -> server: a kv handle); META (server -> consumer: a
// status and message, or the sequence's geometry, tokens and block count); PULL (consumer ->
// server: its landing blocks are ready); BLOCK (server -> consumer, one per block: the bytes,
// as UCX's rendezvous moves them, zero-copy where the transport can); DONE (consumer -> server:
// it has every block, or gives up). The consumer never names an address in the producer: it
// receives what the producer sends. Every length and count is checked before it is used.
// Same host (both ends asked for it): right after connecting the consumer sends HELLO (its UCX
// worker address and identity). The server answers HELLO_CHALLENGE: the address of a random
// nonce in its own memory. The consumer checks that the process named owns the server's end of
// its connection, reads the nonce there (process_vm_readv: the ptrace permission, exactly what
// UCX's shared-memory transports and CMA would give either side over the other) and sends it
// back (HELLO_PROOF). Only then does the server touch the worker address: it makes a second
// endpoint to it, and when UCX reaches the consumer through shared memory it answers
// HELLO_REPLY over that endpoint and sends every META and BLOCK there from then on (FETCH, PULL
// and DONE stay on the first connection, which also tells either end when the other is gone);
// otherwise HELLO_REPLY refuses, saying why, on the first connection.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cxlpool/kvcache.h"

namespace cxlpool::ucx {

inline constexpr uint64_t kWireMagic = 0x324d52564b4c5843ull;  // "CXLKVRM2"
inline constexpr uint32_t kWireVersion = 2;
inline constexpr unsigned kAmFetch = 0x6b31, kAmMeta = 0x6b32, kAmPull = 0x6b33, kAmBlock = 0x6b34, kAmDone = 0x6b35,
                          kAmHello = 0x6b36, kAmHelloReply = 0x6b37, kAmHelloChallenge = 0x6b38, kAmHelloProof = 0x6b39;
inline constexpr uint64_t kMaxBlocks = 1u << 20;
inline constexpr uint32_t kMaxMessage = 1024;
inline constexpr uint32_t kMaxWorkerAddress = 16384;

// Where a process runs: the kernel's boot id and its network, IPC and PID namespaces. UCX's
// shared-memory transports need all four the same (its wakeups go over abstract UNIX sockets,
// which belong to a network namespace; CMA names the peer by its PID).
struct HostIdentity {
  char boot_id[40];                 // /proc/sys/kernel/random/boot_id, NUL-terminated
  uint64_t net_ns, ipc_ns, pid_ns;  // inode numbers of /proc/self/ns/{net,ipc,pid}
};

// HELLO: the consumer's identity, then its worker address (address_bytes).
struct HelloRequest {
  uint64_t magic;
  uint32_t version;
  uint32_t address_bytes;
  HostIdentity where;
};

// HELLO_CHALLENGE: kNonceBytes to read at `address` in process `pid` (the server's, in its PID
// namespace, which the identity check makes the consumer's too).
inline constexpr size_t kNonceBytes = 32;
struct HelloChallenge {
  uint64_t magic;
  uint32_t version;
  int32_t pid;
  uint64_t address;
};

// HELLO_PROOF: what the consumer read there, or why it could not (read_errno).
struct HelloProof {
  uint64_t magic;
  uint32_t version;
  int32_t read_errno;
  unsigned char nonce[kNonceBytes];
};

// HELLO_REPLY: status OK (message: the lanes UCX chose) or the refusal (message: why).
struct HelloReply {
  uint64_t magic;
  uint32_t version;
  int32_t status;
  uint32_t message_bytes;
  uint32_t reserved;
};

struct FetchRequest {
  uint64_t magic;
  uint32_t version;
  uint32_t has_expected;
  uint64_t request_id;
  cxlpool_kv_handle_t handle;
  cxlpool_kv_geometry_t expected;
};

// PULL and DONE.
struct RequestMessage {
  uint64_t magic;
  uint64_t request_id;
};

struct MetaReply {
  uint64_t magic;
  uint32_t version;
  int32_t status;  // cxlpool_status_t; not OK: message_bytes of message follow
  uint64_t request_id;
  cxlpool_kv_geometry_t geometry;
  uint64_t tokens;
  uint64_t blocks;
  uint64_t block_bytes;
  uint32_t message_bytes;
  uint32_t reserved;
};

// The active-message header of a BLOCK; its data is the block.
struct BlockHeader {
  uint64_t magic;
  uint64_t request_id;
  uint64_t index;
};

// A status from the other side as this side may return it: a known cxlpool error, or CORRUPT.
inline cxlpool_status_t known_error(int32_t s) {
  return s < 0 && s >= CXLPOOL_E_DEVICE_FAILED ? cxlpool_status_t(s) : CXLPOOL_E_CORRUPT;
}

}  // namespace cxlpool::ucx
