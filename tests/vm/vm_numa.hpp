// SPDX-License-Identifier: MIT
// Guest helpers of vm_rebind and vm_tiering, independent of cxlpool's own code: where each
// page is (move_pages status query), the memory policy at an address (get_mempolicy), a
// node's free memory, and a filler that occupies a node with memory of its own.
#pragma once

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace vmtest {

constexpr size_t kPage = 4096;
constexpr int kMpolDefault = 0, kMpolPreferred = 1, kMpolBind = 2;
constexpr unsigned kMfMove = 2;

// The node of each page (negative: -errno, e.g. -ENOENT for a page not present).
inline std::vector<int> nodes_of(const void* p, size_t pages) {
  std::vector<int> out(pages, -1);
  std::vector<void*> addr(pages);
  for (size_t i = 0; i < pages; ++i) addr[i] = static_cast<char*>(const_cast<void*>(p)) + i * kPage;
  for (size_t done = 0; done < pages; done += 512) {
    size_t n = std::min<size_t>(512, pages - done);
    if (syscall(SYS_move_pages, 0, n, addr.data() + done, nullptr, out.data() + done, 0) != 0)
      for (size_t i = 0; i < n; ++i) out[done + i] = -1000;  // the query itself failed
  }
  return out;
}

struct Count {
  size_t on = 0, elsewhere = 0, absent = 0;
};
inline Count count_on(const void* p, size_t pages, int node) {
  Count c;
  for (int n : nodes_of(p, pages)) (n == node ? c.on : n >= 0 ? c.elsewhere : c.absent)++;
  return c;
}
inline std::string describe(const Count& c) {
  return std::to_string(c.on) + " on, " + std::to_string(c.elsewhere) + " elsewhere, " + std::to_string(c.absent) +
         " absent";
}

// The policy at p: mode (MPOL_*) and node mask (first word).
inline bool policy_at(const void* p, int* mode, unsigned long* mask) {
  unsigned long words[16] = {};
  int m = -1;
  if (syscall(SYS_get_mempolicy, &m, words, 16 * 64UL, p, 2UL /* MPOL_F_ADDR */) != 0) return false;
  *mode = m;
  *mask = words[0];
  return true;
}

inline long mbind_node(void* p, size_t len, int mode, int node, unsigned flags) {
  unsigned long mask = 1UL << node;
  return syscall(SYS_mbind, p, len, mode, &mask, 65UL, flags);
}

// MemFree of a node in KiB (-1 when unreadable).
inline long node_free_kib(int node) {
  std::ifstream f("/sys/devices/system/node/node" + std::to_string(node) + "/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    auto at = line.find("MemFree:");
    if (at != std::string::npos) return std::stol(line.substr(at + 8));
  }
  return -1;
}

inline bool write_knob(const std::string& path, const std::string& value) {
  std::ofstream f(path);
  f << value;
  f.close();
  return bool(f);
}
inline std::string read_knob(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

// Occupies a node with anonymous memory of this process, preferred there (MPOL_PREFERRED:
// once the node is at its watermark the rest falls back to other nodes, so nothing is
// OOM-killed), in 8 MiB chunks until a chunk no longer lands on the node.
class NodeFiller {
 public:
  static constexpr size_t kChunk = size_t(8) << 20;
  explicit NodeFiller(int node, size_t max_bytes) {
    while (bytes_ < max_bytes) {
      void* c = mmap(nullptr, kChunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (c == MAP_FAILED) break;
      madvise(c, kChunk, MADV_NOHUGEPAGE);
      mbind_node(c, kChunk, kMpolPreferred, node, 0);
      if (madvise(c, kChunk, MADV_POPULATE_WRITE) != 0) std::memset(c, 1, kChunk);
      Count k = count_on(c, kChunk / kPage, node);
      chunks_.push_back(c);
      bytes_ += kChunk;
      on_node_ += k.on * kPage;
      if (k.on < kChunk / kPage) break;  // the node is full: this chunk spilled over
    }
  }
  ~NodeFiller() { release(); }
  NodeFiller(const NodeFiller&) = delete;
  NodeFiller& operator=(const NodeFiller&) = delete;
  // Frees chunks (first ones first, all on the node) until about `bytes` are free there.
  void make_room(size_t bytes) {
    size_t freed = 0;
    while (freed < bytes && !chunks_.empty()) {
      munmap(chunks_.front(), kChunk);
      chunks_.erase(chunks_.begin());
      freed += kChunk;
    }
  }
  void release() {
    for (void* c : chunks_) munmap(c, kChunk);
    chunks_.clear();
  }
  size_t on_node() const { return on_node_; }

 private:
  std::vector<void*> chunks_;
  size_t bytes_ = 0, on_node_ = 0;
};

}  // namespace vmtest
