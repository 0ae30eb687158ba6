// SPDX-License-Identifier: MIT
// The non-coherent view (two views over one buffer = two hosts without cross-host coherence):
// missing publish, missing acquire, false sharing, seeded eviction; and the line primitives.
#include "shared/noncoherent_view.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "shared/coherence.hpp"

using cxlpool::detail::Failure;
using namespace cxlpool::detail::shared;

namespace {

template <size_t N>
struct alignas(64) SharedMem {
  std::array<std::byte, N> bytes{};
  std::byte* data() { return bytes.data(); }
};

void put(std::byte* base, size_t off, uint64_t v) { std::memcpy(base + off, &v, sizeof v); }
uint64_t get(const std::byte* base, size_t off) {
  uint64_t v;
  std::memcpy(&v, base + off, sizeof v);
  return v;
}

}  // namespace

TEST_CASE("non-coherent view: a write without publish never reaches another host", "[unit]") {
  SharedMem<256> mem;
  NoncoherentView writer(mem.data(), 256, 1), reader(mem.data(), 256, 2);
  put(writer.view(), 0, 0x1111);
  CHECK(get(writer.view(), 0) == 0x1111);  // the writer reads its own cache
  CHECK(writer.dirty_lines() == 1);
  reader.acquire(0, 256);
  CHECK(get(reader.view(), 0) == 0);
  CHECK(get(mem.data(), 0) == 0);
  CHECK(reader.counters().lines_refreshed == 4);
  CHECK(reader.counters().lines_written_back == 0);
  CHECK(writer.counters().lines_written_back == 0);
}

TEST_CASE("non-coherent view: published data stays stale for a reader until it acquires", "[unit]") {
  SharedMem<256> mem;
  NoncoherentView writer(mem.data(), 256, 1), reader(mem.data(), 256, 2);
  put(writer.view(), 8, 42);   // line 0
  put(writer.view(), 136, 7);  // line 2
  put(writer.view(), 200, 9);  // line 3: outside the publish below
  writer.publish(0, 192);
  CHECK(writer.counters().lines_written_back == 2);
  CHECK(writer.dirty_lines() == 1);
  CHECK(get(mem.data(), 8) == 42);
  CHECK(get(mem.data(), 136) == 7);
  CHECK(get(mem.data(), 200) == 0);

  CHECK(get(reader.view(), 8) == 0);  // its cache still holds the old line
  reader.acquire(64, 64);             // line 1 only
  CHECK(get(reader.view(), 8) == 0);
  reader.acquire(8, 8);  // line 0 only
  CHECK(get(reader.view(), 8) == 42);
  CHECK(get(reader.view(), 136) == 0);
  reader.acquire(0, 256);
  CHECK(get(reader.view(), 136) == 7);
  CHECK(get(reader.view(), 200) == 0);

  // A write-back is of whole lines: one byte of the range publishes all of line 3.
  put(writer.view(), 248, 5);
  writer.publish(199, 1);
  CHECK(get(mem.data(), 200) == 9);
  CHECK(get(mem.data(), 248) == 5);
  CHECK(writer.dirty_lines() == 0);
}

TEST_CASE("non-coherent view: acquiring loses nothing unless the reader dirtied the line", "[unit]") {
  SharedMem<256> mem;
  NoncoherentView writer(mem.data(), 256, 1), reader(mem.data(), 256, 2);
  put(writer.view(), 0, 0xabc);
  writer.publish(0, 64);
  reader.acquire(0, 256);
  CHECK(reader.counters().lines_written_back == 0);
  CHECK(get(mem.data(), 0) == 0xabc);
  CHECK(get(reader.view(), 0) == 0xabc);

  // A reader that writes into a line it does not own (a local flag, say) has it written back
  // by its next acquire, clobbering what the owner published meanwhile.
  put(reader.view(), 64, 1);
  put(writer.view(), 72, 0xdef);
  writer.publish(64, 64);
  reader.acquire(0, 256);
  CHECK(reader.counters().lines_written_back == 1);
  CHECK(reader.counters().conflicting_writebacks == 1);
  CHECK(get(mem.data(), 72) == 0);  // the owner's bytes are gone
  CHECK(get(mem.data(), 64) == 1);
}

TEST_CASE("non-coherent view: false sharing loses one host's bytes and is counted", "[unit]") {
  SharedMem<192> mem;
  NoncoherentView a(mem.data(), 192, 1), b(mem.data(), 192, 2);
  a.view()[0] = std::byte{0xaa};  // both in line 0
  b.view()[1] = std::byte{0xbb};
  a.view()[64] = std::byte{0x11};  // lines 1 and 2: both survive
  b.view()[191] = std::byte{0x22};
  a.publish(0, 192);
  b.publish(0, 192);
  CHECK(mem.bytes[1] == std::byte{0xbb});
  CHECK(mem.bytes[0] == std::byte{0});  // a's byte clobbered by b's whole-line write-back
  CHECK(a.counters().conflicting_writebacks == 0);
  CHECK(b.counters().conflicting_writebacks == 1);
  CHECK(mem.bytes[64] == std::byte{0x11});
  CHECK(mem.bytes[191] == std::byte{0x22});
  CHECK(a.counters().lines_written_back == 2);
  CHECK(b.counters().lines_written_back == 2);
}

TEST_CASE("non-coherent view: arguments are checked", "[unit]") {
  SharedMem<256> mem;
  auto status_of = [](auto&& f) {
    try {
      f();
    } catch (const Failure& e) {
      return e.status();
    }
    return CXLPOOL_OK;
  };
  CHECK(status_of([&] { NoncoherentView v(mem.data() + 8, 128, 0); }) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(status_of([&] { NoncoherentView v(mem.data(), 100, 0); }) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(status_of([&] { NoncoherentView v(mem.data(), 0, 0); }) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(status_of([&] { NoncoherentView v(nullptr, 64, 0); }) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK_THROWS_WITH(NoncoherentView(mem.data(), 100, 0), Catch::Contains("length 100"));
  CHECK_THROWS_WITH(NoncoherentView(mem.data() + 8, 128, 0), Catch::Contains("not aligned"));

  NoncoherentView v(mem.data(), 256, 0);
  CHECK(status_of([&] { v.publish(200, 57); }) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(status_of([&] { v.acquire(257, 0); }) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK(status_of([&] { v.acquire(8, SIZE_MAX); }) == CXLPOOL_E_INVALID_ARGUMENT);
  CHECK_THROWS_WITH(v.publish(200, 57), Catch::Contains("[200, +57)"));
  CHECK(status_of([&] { v.publish(256, 0); }) == CXLPOOL_OK);
  CHECK(status_of([&] { v.acquire(200, 56); }) == CXLPOOL_OK);

  CHECK(v.view_offset_of(v.view() + 77) == 77);
  CHECK(v.contains(v.view(), 256));
  CHECK_FALSE(v.contains(v.view() + 1, 256));
  CHECK_FALSE(v.contains(v.view() - 1, 1));
  CHECK(status_of([&] { (void)v.view_offset_of(v.view() + 256); }) == CXLPOOL_E_INVALID_ARGUMENT);
}

namespace {

struct EvictionRun {
  uint64_t digest = 0, evicted = 0, written_back = 0, refreshed = 0;
  std::vector<std::byte> shared;
};

// One host dirtying lines and calling only publish(0, 0) and acquire(0, 64): whatever else
// reaches the shared range got there by eviction.
EvictionRun run_evictions(uint64_t seed, size_t evict_per_call) {
  SharedMem<1024> mem;
  NoncoherentView v(mem.data(), 1024, seed, {evict_per_call});
  for (size_t r = 0; r < 300; ++r) {
    v.view()[64 + (r * 37) % 960] = static_cast<std::byte>(r | 1);
    if (r % 2)
      v.publish(0, 0);
    else
      v.acquire(0, 64);
  }
  auto& c = v.counters();
  return {v.eviction_digest(), c.lines_evicted, c.lines_written_back, c.lines_refreshed,
          std::vector<std::byte>(mem.bytes.begin(), mem.bytes.end())};
}

}  // namespace

TEST_CASE("non-coherent view: eviction is a function of the seed and the calls", "[unit]") {
  EvictionRun a = run_evictions(7, 3), b = run_evictions(7, 3), c = run_evictions(8, 3);
  CHECK(a.evicted == 900);
  CHECK(a.digest == b.digest);
  CHECK(a.written_back == b.written_back);
  CHECK(a.refreshed == b.refreshed);
  CHECK(a.shared == b.shared);
  CHECK(a.written_back > 0);  // some dirty lines were evicted
  CHECK(a.digest != c.digest);
  CHECK(a.shared != c.shared);

  // Eviction of clean lines reloads them: a host that never acquires still sees, in time,
  // what another host published (and, with no dirty line, writes nothing back).
  SharedMem<1024> mem;
  NoncoherentView writer(mem.data(), 1024, 1), idle(mem.data(), 1024, 2, {4});
  for (size_t off = 0; off < 1024; off += 64) put(writer.view(), off, off + 1);
  writer.publish(0, 1024);
  for (int i = 0; i < 100; ++i) idle.publish(0, 0);
  size_t seen = 0;
  for (size_t off = 0; off < 1024; off += 64) seen += get(idle.view(), off) == off + 1 ? 1 : 0;
  CHECK(seen == 16);
  CHECK(idle.counters().lines_refreshed == 400);
  CHECK(idle.counters().lines_written_back == 0);

  EvictionRun none = run_evictions(7, 0);  // the default: nothing happens between calls
  CHECK(none.evicted == 0);
  CHECK(none.written_back == 0);
  CHECK(none.shared == std::vector<std::byte>(1024));
}

namespace {

// A single-writer log over the shared range: a head (sequence number, own 128 bytes) and a
// ring of kSlots records {seq, payload, checksum} of three lines each. The writer fills the
// next slot, publishes it, then writes and publishes the head; a reader acquires the head,
// then the slot it names, and checks the record's sequence number and checksum.
constexpr size_t kSlots = 4, kRecord = 192, kPayloadWords = 22, kLogBytes = 128 + kSlots * kRecord;
constexpr size_t slot_offset(uint64_t seq) { return 128 + (seq % kSlots) * kRecord; }

uint64_t checksum(const uint64_t* words, size_t n) {
  uint64_t h = 14695981039346656037ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ words[i]) * 1099511628211ull;
  return h;
}

struct Protocol {
  bool writer_publishes_payload = true;
  bool reader_acquires_payload = true;
};

struct Outcome {
  uint64_t reads = 0, verified = 0, stale = 0, torn = 0, anomalies = 0, records = 0;
};

Outcome simulate(uint64_t seed, size_t evict_per_call, Protocol p, int steps) {
  SharedMem<kLogBytes> mem;
  NoncoherentView writer(mem.data(), kLogBytes, seed, {evict_per_call});
  NoncoherentView reader(mem.data(), kLogBytes, seed * 31 + 17, {evict_per_call});
  std::mt19937_64 schedule(seed);
  Outcome out;
  int stage = 0;
  uint64_t published = 0, last_head = 0;
  for (int step = 0; step < steps; ++step) {
    if (schedule() % 2 == 0) {  // one step of the writer
      uint64_t next = published + 1;
      switch (stage) {
        case 0: {
          uint64_t rec[kRecord / 8];
          rec[0] = next;
          for (size_t i = 0; i < kPayloadWords; ++i) rec[1 + i] = next * 1000003 + i;
          rec[kPayloadWords + 1] = checksum(rec, kPayloadWords + 1);
          std::memcpy(writer.view() + slot_offset(next), rec, kRecord);
          break;
        }
        case 1:
          if (p.writer_publishes_payload) writer.publish(slot_offset(next), kRecord);
          break;
        case 2:
          put(writer.view(), 0, next);
          break;
        case 3:
          writer.publish(0, 8);
          published = next;
          ++out.records;
          break;
      }
      stage = (stage + 1) % 4;
      continue;
    }
    reader.acquire(0, 8);  // one read by the reader
    uint64_t head = get(reader.view(), 0);
    if (head < last_head || head > published + 1) ++out.anomalies;
    last_head = head;
    if (head == 0) continue;
    ++out.reads;
    if (p.reader_acquires_payload) reader.acquire(slot_offset(head), kRecord);
    uint64_t rec[kRecord / 8];
    std::memcpy(rec, reader.view() + slot_offset(head), kRecord);
    if (rec[0] != head)
      ++out.stale;
    else if (rec[kPayloadWords + 1] != checksum(rec, kPayloadWords + 1))
      ++out.torn;
    else
      ++out.verified;
  }
  return out;
}

}  // namespace

TEST_CASE("non-coherent view: publish/acquire discipline survives eviction, its absence does not", "[unit]") {
  for (uint64_t seed : {1u, 2u, 3u, 4u, 5u}) {
    INFO("seed " << seed);
    Outcome ok = simulate(seed, 2, {}, 20000);
    CHECK(ok.records > 2000);
    CHECK(ok.verified == ok.reads);
    CHECK(ok.verified > 2000);
    CHECK(ok.stale == 0);
    CHECK(ok.torn == 0);
    CHECK(ok.anomalies == 0);
  }
  // A reader that acquires the head but reads the record from its cache.
  Outcome no_acquire = simulate(1, 2, {.reader_acquires_payload = false}, 20000);
  CHECK(no_acquire.stale > 0);
  CHECK(no_acquire.verified < no_acquire.reads);
  // A writer that publishes the head but leaves the record to eviction.
  Outcome no_publish = simulate(1, 2, {.writer_publishes_payload = false}, 20000);
  CHECK(no_publish.stale + no_publish.torn > 0);
  CHECK(no_publish.verified < no_publish.reads);
  // Without eviction the same bugs are total, not occasional.
  Outcome frozen = simulate(1, 0, {.reader_acquires_payload = false}, 20000);
  CHECK(frozen.reads > 0);
  CHECK(frozen.verified == 0);
}

TEST_CASE("coherence: line write-back and flush over aligned and unaligned ranges", "[unit]") {
  CHECK(lines_spanned(0, 0) == 0);
  CHECK(lines_spanned(63, 1) == 1);
  CHECK(lines_spanned(63, 2) == 2);
  CHECK(lines_spanned(0, 64) == 1);
  CHECK(lines_spanned(0, 65) == 2);
  CHECK(lines_spanned(64, 64) == 1);
  CHECK(lines_spanned(100, 4096) == 65);

  const FlushSupport& s = flush_support();
  std::string wb = line_op_name(writeback_op()), inv = line_op_name(invalidate_op());
  std::printf("coherence: publish uses %s, acquire uses %s (cpuid: clflush=%d clflushopt=%d clwb=%d)\n", wb.c_str(),
              inv.c_str(), s.clflush, s.clflushopt, s.clwb);
#if defined(__x86_64__) || defined(__i386__)
  CHECK(s.clflush);  // CLFSH is part of every x86-64
  CHECK(wb == (s.clwb ? "clwb" : s.clflushopt ? "clflushopt" : "clflush"));
  CHECK(inv == (s.clflushopt ? "clflushopt" : "clflush"));
#else
  CHECK(wb == "none");
#endif
  CHECK(std::string(line_op_name(LineOp::kClwb)) == "clwb");
  CHECK(std::string(line_op_name(LineOp::kNone)) == "none");

  // Two read-write pages followed by an inaccessible one: a flush of a line outside the range
  // (one past its end) would fault on the guard page.
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* map = mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(map != MAP_FAILED);
  auto* base = static_cast<unsigned char*>(map);
  REQUIRE(mprotect(base + 2 * page, page, PROT_NONE) == 0);
  unsigned char* end = base + 2 * page;
  for (size_t i = 0; i < 2 * page; ++i) base[i] = static_cast<unsigned char>(i * 7 + 3);
  std::vector<unsigned char> before(base, end);

  struct Range {
    size_t off, n;
  };
  const Range ranges[] = {
      {0, 2 * page},       {0, 64},       {3, 61}, {60, 8}, {1, 2 * page - 1}, {2 * page - 1, 1}, {2 * page - 100, 100},
      {2 * page - 64, 64}, {2 * page, 0}, {5, 0}};
  std::vector<LineOp> ops;
  if (s.clflush) ops.push_back(LineOp::kClflush);
  if (s.clflushopt) ops.push_back(LineOp::kClflushopt);
  if (s.clwb) ops.push_back(LineOp::kClwb);
  for (const Range& r : ranges) {
    INFO("range +" << r.off << " n=" << r.n);
    writeback_lines(base + r.off, r.n);
    invalidate_lines(base + r.off, r.n);
    for (LineOp op : ops) apply_line_op(op, base + r.off, r.n);
    full_fence();
    CHECK(std::memcmp(before.data(), base, before.size()) == 0);
  }
  writeback_lines(nullptr, 0);
  invalidate_lines(nullptr, 0);
  munmap(map, 3 * page);
}
