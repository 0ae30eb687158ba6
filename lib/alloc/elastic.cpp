// SPDX-License-Identifier: MIT
// Elastic capacity, the allocator's half (pool.hpp; the device's half is device/elastic.cpp):
// a device open in this process grows at once (every pool's routes, spill watermarks and
// region sizes read its capacity where they use it), and shrinks by withdrawing an extent:
// free memory of the pools goes back first, then what the pools hold in the extent or past
// the new capacity moves under the same addresses to another device of its pool (move_unit),
// and only then is the extent's memory freed. Nothing is lost: what cannot move makes the
// withdrawal BUSY, naming it, and the extent comes back.
#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <vector>

#include "alloc/internal.hpp"
#include "common/error.hpp"
#include "common/parse.hpp"
#include "device/registry.hpp"
#include "os/os.hpp"
#include "os/prim.hpp"

namespace cxlpool::detail::alloc {

namespace {

// One capacity change at a time in the process: a withdrawal's evacuation must not race
// another's on the same pools.
std::mutex g_elastic_mu;

// The process's lost handler (set_lost_handler).
std::mutex g_lost_mu;
LostHandler g_lost_handler = nullptr;
void* g_lost_ctx = nullptr;

std::atomic<OutsideMoveBegin> g_outside_begin{nullptr};
std::atomic<OutsideMoveEnd> g_outside_end{nullptr};
std::atomic<PinCheck> g_pin_check{nullptr};

// Units a withdrawal moved off a device (g_elastic_mu): when the device grows again they go
// back to it, so that the placement they had holds again: the policy's (bind:DEV means DEV),
// a pin's (a unit pinned to DEV's tier) or the tiering engine's. A unit moved since by anyone
// else stays where that move put it.
struct Evacuated {
  const Device* from_device;  // compared, never dereferenced
  UnitRef ref;
  int from;  // the pool's index of from_device
  int to;    // where the withdrawal put the unit
};
std::vector<Evacuated>* g_evacuated = nullptr;

// move_unit for moves outside the tiering engine: a running engine's monitors stop watching
// the unit while it moves (set_outside_moves).
cxlpool_status_t move_outside(const UnitRef& ref, int to, UnitMove* um, std::string* why) noexcept {
  UnitHook hook = nullptr;
  void* ctx = nullptr;
  const OutsideMoveBegin begin = g_outside_begin.load(std::memory_order_acquire);
  const bool engine = begin && begin(&hook, &ctx);
  const cxlpool_status_t s = move_unit(ref, to, um, why, hook, ctx);
  if (engine) g_outside_end.load(std::memory_order_acquire)();
  return s;
}

// A numa device's capacity is a budget of pages on its node: never more than the node has
// (its MemTotal now), or a policy would keep binding pages there past the node's memory
// instead of spilling. Empty when capacity fits (or the node's memory cannot be read).
// Its offsets stay below the node's memory too, as max_space_bytes says.
std::string past_node_memory(const Device& dev, uint64_t capacity, uint64_t end) {
  if (dev.caps().kind != CXLPOOL_BACKING_NUMA) return "";
  const std::optional<uint64_t> node = node_memory_of(dev);
  if (!node || (capacity <= *node && end <= *node)) return "";
  const std::string has = "node " + std::to_string(dev.spec().numa_node) + " has (" + format_bytes(*node) + ", " +
                          std::to_string(*node) + " bytes of memory now)";
  if (capacity > *node)
    return "a capacity of " + format_bytes(capacity) + " (" + std::to_string(capacity) + " bytes) is more than " + has;
  return "offsets up to " + std::to_string(end) + " are past the memory " + has;
}

bool has_room(const Device& d, uint64_t bytes) noexcept { return d.committed() + bytes <= d.capacity(); }

std::string format_hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%" PRIx64, v);
  return buf;
}

int index_on(const Pool* pool, const Device* dev) noexcept {
  for (int i = 0; i < pool->ndev; ++i)
    if (pool->dev[i].device.get() == dev) return i;
  return -1;
}

// Gives back the free memory of every pool on dev: it needs no move. Bytes given back.
uint64_t trim_pools_on(const Device& dev) noexcept {
  const uint64_t before = dev.committed();
  {
    std::lock_guard<std::mutex> registry(g_registry_mu);
    for (const RegistryEntry& e : g_registry)
      if (e.pool && !e.pool->detached && index_on(e.pool, &dev) >= 0) pool_trim(e.pool);
  }
  const uint64_t after = dev.committed();
  return before > after ? before - after : 0;
}

// A unit of some pool whose bytes are on the device being shrunk.
struct Candidate {
  UnitRef ref;
  uint64_t committed = 0;
  size_t size = 0;
  bool in_range = false;                   // holds part of the withdrawn extent
  bool can_move = false;                   // a private pool of two devices or more
  int order[kMaxDevices];                  // targets to try, in the pool's policy order
  const Device* target[kMaxDevices] = {};  // their devices (alive: PoolsAlive is held)
  int ntargets = 0;
  int here = 0;  // the pool's index of the device being withdrawn from
  char pool_name[48] = {};
  char why[96] = {};  // why it cannot move, when it cannot
};

// The pool's devices in the order its policy names them, then the rest in pool order
// (nearest tier first), without `skip`.
int policy_order(const Pool* pool, int skip, int* out) noexcept {
  int n = 0;
  auto add = [&](int d) {
    if (d < 0 || d >= pool->ndev || d == skip) return;
    for (int i = 0; i < n; ++i)
      if (out[i] == d) return;
    out[n++] = d;
  };
  for (const Rule& r : pool->policy.rules) {
    for (int d : r.devices) add(d);
    for (int d : r.fallback) add(d);
  }
  for (int d = 0; d < pool->ndev; ++d) add(d);
  return n;
}

void list_units(const Device& dev, const std::vector<Device::Occupant>& occupants, std::vector<Candidate>* out) {
  auto in_range = [&](uintptr_t base) {
    for (const auto& o : occupants)
      if (o.addr == base) return true;
    return false;
  };
  std::lock_guard<std::mutex> registry(g_registry_mu);
  for (const RegistryEntry& e : g_registry) {
    Pool* pool = e.pool;
    if (!pool) continue;
    const int here = index_on(pool, &dev);
    if (here < 0) continue;
    const bool can_move = !pool->detached && pool->sharing == Sharing::kPrivate && pool->ndev >= 2;
    for (int di = 0; di < pool->ndev; ++di) {
      PoolDevice& d = pool->dev[di];
      std::lock_guard<std::mutex> lock(d.mu);
      auto add = [&](uintptr_t base, uint64_t serial, int resident, size_t size, uint64_t committed) {
        if (resident != here) return;
        Candidate c;
        c.ref = {pool->index, pool->generation, base, serial, di};
        c.committed = committed;
        c.size = size;
        c.in_range = in_range(base);
        c.can_move = can_move;
        c.ntargets = policy_order(pool, here, c.order);
        for (int i = 0; i < c.ntargets; ++i) c.target[i] = pool->dev[c.order[i]].device.get();
        c.here = here;
        std::snprintf(c.pool_name, sizeof c.pool_name, "%s", pool->name.c_str());
        if (!can_move)
          std::snprintf(c.why, sizeof c.why, "%s",
                        pool->detached || pool->sharing != Sharing::kPrivate
                            ? "its memory is shared with forked children"
                            : "the pool has no other device");
        out->push_back(c);
      };
      for (const Region& r : d.regions)
        if (r.segments) {
          uint64_t committed = 0;
          for (size_t s = 0; s < r.segments; ++s) {
            if (!(r.used >> s & 1)) continue;
            SegmentHeader* hdr = pagemap_lookup(reinterpret_cast<void*>(r.base + s * kSegmentSize));
            if (!hdr || hdr->kind != ArenaKind::kHeapSmall || hdr->pool != pool) continue;
            const uint64_t slices = static_cast<Segment*>(hdr)->committed_slices;
            // Coarse devices (pages above a slice) commit whole segments (as residency.cpp counts).
            committed += d.coarse && slices ? kSegmentSize : uint64_t(__builtin_popcountll(slices)) << kSliceShift;
          }
          add(r.base, r.serial, r.resident, r.segments * kSegmentSize, committed);
        }
      for (HugeSpan* list : {d.huge_live, d.huge_cache})
        for (HugeSpan* s = list; s; s = s->next) add(s->base, s->serial, s->resident, s->block, s->committed);
    }
  }
}

struct Outcome {
  uint64_t units = 0, bytes = 0;
  std::string first_refusal;  // why the first unit that had to move did not
};

std::string unit_text(const Candidate& c) {
  return "a unit of pool '" + std::string(c.pool_name) + "' at " + format_hex(c.ref.base) + " (" +
         format_bytes(c.committed) + " committed)";
}

// Before anything moves: a withdrawal that cannot succeed (what must leave cannot, or the
// devices it could go to have too little room) is refused with nothing moved.
bool doomed(const Device& dev, const std::vector<Device::Occupant>& occupants, const std::vector<Candidate>& units,
            uint64_t excess, Outcome* out) {
  for (const Device::Occupant& o : occupants)
    if (o.shared || o.mapped || o.client >= kFirstRawClient) return true;  // never moves (holders() says which)
  uint64_t must = 0, movable = 0;
  std::vector<const Device*> targets;
  for (const Candidate& c : units) {
    if (c.in_range && !c.can_move) {
      out->first_refusal = unit_text(c) + " cannot move: " + c.why;
      return true;
    }
    if (!c.can_move) continue;
    if (c.in_range) must += c.committed;
    movable += c.committed;
    for (int i = 0; i < c.ntargets; ++i)
      if (c.target[i] != &dev && std::find(targets.begin(), targets.end(), c.target[i]) == targets.end())
        targets.push_back(c.target[i]);
  }
  if (movable < excess) {
    out->first_refusal = format_bytes(excess) + " must leave the device and only " + format_bytes(movable) +
                         " of the pools' memory there can move (pools with one device or shared memory stay)";
    return true;
  }
  must = std::max(must, excess);
  uint64_t room = 0;
  for (const Device* t : targets) room += t->capacity() > t->committed() ? t->capacity() - t->committed() : 0;
  if (room < must) {
    out->first_refusal =
        format_bytes(must) + " must leave the device and the pools' other devices have room for " + format_bytes(room);
    return true;
  }
  return false;
}

// Moves units off dev: every unit in the withdrawn extent, then (largest first) as many as it
// takes to bring the committed bytes within the capacity.
void evacuate(Device& dev, bool all_or_nothing, Outcome* out) {
  PoolsAlive alive;  // the candidates' pools (and so their devices) stay until the moves end
  for (int pass = 0; pass < 3; ++pass) {
    const std::vector<Device::Occupant> occupants = dev.occupants();
    uint64_t excess = dev.committed() > dev.capacity() ? dev.committed() - dev.capacity() : 0;
    if (occupants.empty() && excess == 0) return;
    std::vector<Candidate> units;
    list_units(dev, occupants, &units);
    if (pass == 0 && all_or_nothing && doomed(dev, occupants, units, excess, out)) return;
    std::stable_sort(units.begin(), units.end(), [](const Candidate& a, const Candidate& b) {
      return a.in_range != b.in_range ? a.in_range : a.committed > b.committed;
    });
    bool moved_any = false;
    for (const Candidate& c : units) {
      if (!c.in_range && (excess == 0 || c.committed == 0)) continue;  // nothing to gain
      auto refuse = [&](const std::string& why) {
        if (out->first_refusal.empty()) out->first_refusal = unit_text(c) + " " + why;
      };
      if (!c.can_move) {
        refuse(std::string("cannot move: ") + c.why);
        continue;
      }
      cxlpool_status_t last = CXLPOOL_E_CAPACITY;
      std::string message = "no other device of the pool has room for it";
      for (int i = 0; i < c.ntargets; ++i) {
        if (!has_room(*c.target[i], c.committed)) continue;  // skipped, not tried
        UnitMove um;
        std::string why;
        // A move of the unit already running (the tiering engine's, a pin's) is waited out; if
        // it took the unit to this target, the unit has left the device all the same.
        for (unsigned wait_ms = 1;; wait_ms = std::min(wait_ms * 2, 8u)) {
          last = move_outside(c.ref, c.order[i], &um, &why);
          if (last != CXLPOOL_E_BUSY || !um.moving) break;
          os::prim::sleep_ms(wait_ms);
        }
        // A move running meanwhile (the tiering engine's) took the unit where this one would
        // have: it has left the device for this withdrawal all the same, counted and noted as
        // if moved here, so that it comes back when the device grows.
        const bool carried = last == CXLPOOL_E_NOT_SUPPORTED && um.already;
        if (last == CXLPOOL_OK || carried) {
          const uint64_t bytes = carried ? c.committed : um.bytes;
          last = CXLPOOL_OK;
          ++out->units;
          out->bytes += bytes;
          dev.note_evacuated(1, bytes);
          excess -= std::min(excess, bytes);
          moved_any = true;
          try {
            if (!g_evacuated) g_evacuated = new std::vector<Evacuated>();
            g_evacuated->push_back({&dev, c.ref, c.here, c.order[i]});
          } catch (...) {
            // Out of host memory for the note: the unit stays where it went when the device grows.
          }
          break;
        }
        if (last == CXLPOOL_E_NOT_FOUND) break;  // freed meanwhile: nothing to move
        message = why;
      }
      if (last != CXLPOOL_OK && last != CXLPOOL_E_NOT_FOUND) refuse("could not move: " + message);
    }
    if (!moved_any) return;
  }
}

// The hook of a move back, checked under the home lock atomically with the unit's becoming
// moving: declines when the unit is no longer where the withdrawal put it (a pin or the engine
// that moved it since has the last word) or a pin keeps it from the device; then runs the
// engine's hook when one watches.
struct ReturnCheck {
  int expected, to;
  UnitHook inner;
  void* inner_ctx;
  bool moved_since = false;
};
bool return_check(void* p, const Unit& unit, bool after, cxlpool_status_t status) {
  auto* c = static_cast<ReturnCheck*>(p);
  if (!after) {
    c->moved_since = unit.resident != c->expected;
    if (c->moved_since) return false;
    const PinCheck pinned = g_pin_check.load(std::memory_order_acquire);
    if (pinned && !pinned(unit, c->to)) return false;
  }
  return c->inner ? c->inner(c->inner_ctx, unit, after, status) : true;
}

// After dev grew: units a withdrawal had moved off it go back while it has room for them.
void return_home(Device& dev, CapacityReport* report) {
  if (!g_evacuated) return;
  PoolsAlive alive;
  std::vector<Evacuated> keep;
  for (const Evacuated& e : *g_evacuated) {
    if (e.from_device != &dev) {
      keep.push_back(e);
      continue;
    }
    Unit u;
    struct Ctx {
      Unit* u;
    } ctx{&u};
    const bool alive_unit = with_unit(
        e.ref, [](void* p, const Unit& unit) { *static_cast<Ctx*>(p)->u = unit; }, &ctx);
    // Freed (its reservation gone, or nothing committed in it: the next block placed in it goes
    // where it is, and nothing is worth a move), or moved since by someone else.
    if (!alive_unit || u.committed == 0 || u.resident != e.to) continue;
    if (!has_room(dev, u.committed)) {
      keep.push_back(e);  // the next growth may have room
      continue;
    }
    ReturnCheck check{e.to, e.from, nullptr, nullptr};
    const OutsideMoveBegin begin = g_outside_begin.load(std::memory_order_acquire);
    const bool engine = begin && begin(&check.inner, &check.inner_ctx);
    UnitMove um;
    const cxlpool_status_t s = move_unit(e.ref, e.from, &um, nullptr, return_check, &check);
    if (engine) g_outside_end.load(std::memory_order_acquire)();
    if (s == CXLPOOL_OK) {
      ++report->returned_units;
      report->returned_bytes += um.bytes;
    } else if (s != CXLPOOL_E_NOT_FOUND && !check.moved_since) {
      keep.push_back(e);  // no room after all, moving now or pinned away: the next growth asks again
    }
  }
  g_evacuated->swap(keep);
}

// What still holds the withdrawal, for the BUSY message: first why the allocator could not
// move it, then what is left, by kind.
std::string holders(const Device& dev, const Outcome& o) {
  std::string why = o.first_refusal;
  struct Kind {
    const char* what;
    uint64_t bytes = 0, count = 0;
  } kinds[] = {{"pools' memory"},
               {"raw backings' reservations (cxlpool_backing_reserve)"},
               {"memory shared with other processes or forked children"},
               {"raw backings' mappings of device ranges"}};
  for (const Device::Occupant& occ : dev.occupants()) {
    Kind& k = occ.mapped ? kinds[3] : occ.shared ? kinds[2] : occ.client >= kFirstRawClient ? kinds[1] : kinds[0];
    k.bytes += occ.hi - occ.lo;
    ++k.count;
  }
  for (const Kind& k : kinds)
    if (k.count) {
      if (!why.empty()) why += "; ";
      why += format_bytes(k.bytes) + " of the range held by " + std::to_string(k.count) + " reservation" +
             (k.count > 1 ? "s" : "") + " of " + k.what;
    }
  if (dev.committed() > dev.capacity()) {
    if (!why.empty()) why += "; ";
    why += format_bytes(dev.committed()) + " committed, " + format_bytes(dev.committed() - dev.capacity()) +
           " more than the capacity would be";
  }
  return why;
}

void say(std::string* message, const std::string& text) noexcept {
  if (!message) return;
  try {
    *message = text;
  } catch (...) {
  }
}

// The words for a failed extent operation of the device layer.
std::string extent_failure(const Device& dev, const char* op, uint64_t lo, uint64_t len, const DeviceError& err) {
  std::string text =
      "device '" + dev.name() + "': " + op + " of " + format_bytes(len) + " at offset " + format_hex(lo) + ": ";
  const std::string call = err.call;
  if (call.find("not online") != std::string::npos)
    text += "the range is not all online capacity (cxlpool_device_get_extents lists what is)";
  else if (call.find("online already") != std::string::npos)
    text += "part of the range is online already, or being withdrawn";
  else if (call.find("past the device's end") != std::string::npos)
    text += "the device can grow to " + format_bytes(err.detail) +
            " of offset space (its max_size; a devdax device's size)";
  else if (call.find("another withdrawal") != std::string::npos)
    text += "another withdrawal is in progress";
  else
    text += call + (err.os_errno ? std::string(": ") + std::strerror(err.os_errno) : std::string());
  return text;
}

// Argument checks every extent operation shares: the words the caller gets.
cxlpool_status_t check_extent(const Device& dev, const char* op, uint64_t offset, uint64_t length,
                              std::string* message) {
  const uint64_t ps = dev.caps().page_size;
  std::string why;
  if (length == 0)
    why = "an empty extent (length 0)";
  else if (offset + length < offset)
    why = "offset + length wraps around";
  else if (offset % ps || length % ps)
    why = "offset and length must be multiples of the device's page size (" + format_bytes(ps) + ")";
  if (why.empty()) return CXLPOOL_OK;
  say(message, "device '" + dev.name() + "': " + op + " of " + std::to_string(length) + " bytes at offset " +
                   format_hex(offset) + ": " + why);
  return CXLPOOL_E_INVALID_ARGUMENT;
}

cxlpool_status_t withdraw_locked(Device& dev, uint64_t lo, uint64_t hi, CapacityReport* report, std::string* message) {
  report->trimmed_bytes += trim_pools_on(dev);
  DeviceError err;
  if (cxlpool_status_t s = dev.begin_withdraw(lo, hi, &err)) {
    say(message, extent_failure(dev, "withdraw", lo, hi - lo, err));
    return s;
  }
  Outcome o;
  evacuate(dev, /*all_or_nothing=*/true, &o);
  report->evacuated_units += o.units;
  report->evacuated_bytes += o.bytes;
  cxlpool_status_t s = dev.end_withdraw(true, &err);
  if (s == CXLPOOL_E_BUSY) {
    say(message, "device '" + dev.name() + "': cannot withdraw " + format_bytes(hi - lo) + " at offset " +
                     format_hex(lo) + "; the extent stays online" +
                     (o.units ? " (" + std::to_string(o.units) + " units that moved stay where they went)" : "") +
                     ": " + holders(dev, o));
    dev.end_withdraw(false, nullptr);
    return s;
  }
  if (s != CXLPOOL_OK) say(message, extent_failure(dev, "withdraw", lo, hi - lo, err));
  return s;
}

// Who held a lost range, for messages and the lost handler.
std::string holder_of(const Device::Lost& x) {
  if (x.mapped) return "a raw backing's mapping of the device range";
  if (x.client >= kFirstRawClient) return "a raw backing's reservation";
  std::lock_guard<std::mutex> registry(g_registry_mu);
  for (const RegistryEntry& e : g_registry)
    if (e.pool && int(e.pool->index) == x.client)
      return "pool '" + e.pool->name + "' (#" + std::to_string(e.pool->index) + ")" +
             (x.shared ? " (memory shared with forked children)" : "");
  return "a pool closed since";
}

// Marks or unmarks, in each device's lock, the segment slots of pool's regions and its huge
// spans that slot(base, len) picks (mark_lost, unmark_regained): a marked slot is never taken
// again, a marked live segment carves no new page and its pages serve nothing more
// (page_has_free), a marked huge span is released, not cached, when freed.
template <class Picks>
void set_lost(Pool* pool, bool lost, Picks&& picks) {
  for (int di = 0; di < pool->ndev; ++di) {
    PoolDevice& d = pool->dev[di];
    std::lock_guard<std::mutex> lock(d.mu);
    for (Region& r : d.regions)
      for (size_t k = 0; k < r.segments; ++k) {
        const uintptr_t base = r.base + k * kSegmentSize;
        if (bool(r.lost >> k & 1) == lost || !picks(r.resident, base, kSegmentSize)) continue;
        r.lost ^= uint64_t(1) << k;
        SegmentHeader* hdr = (r.used >> k & 1) ? pagemap_lookup(reinterpret_cast<void*>(base)) : nullptr;
        if (hdr && hdr->kind == ArenaKind::kHeapSmall && hdr->pool == pool)
          static_cast<Segment*>(hdr)->lost.store(lost, std::memory_order_relaxed);
      }
    for (HugeSpan* list : {d.huge_live, d.huge_cache})
      for (HugeSpan* span = list; span; span = span->next)
        if (span->lost != lost && picks(span->resident, span->base, span->block)) span->lost = lost;
  }
}

// What a forced release took from a pool's unit stops serving: commits there are CAPACITY,
// and a malloc meeting a free slice of a lost segment returned NULL while the device had room.
void mark_lost(const Device::Lost& x) noexcept {
  if (x.client >= kFirstRawClient) return;
  std::lock_guard<std::mutex> registry(g_registry_mu);
  for (const RegistryEntry& e : g_registry)
    if (e.pool && int(e.pool->index) == x.client)
      set_lost(e.pool, true,
               [&](int, uintptr_t base, size_t len) { return base < x.addr + x.len && x.addr < base + len; });
}

// After dev grew: what is marked lost on dev and has all its offsets online again serves anew
// (commits there succeed once the range is back).
void unmark_regained(Device& dev) noexcept {
  std::vector<Device::Extent> online;
  try {
    online = dev.online_extents();
  } catch (...) {
    return;  // out of host memory: they stay marked (nothing handed out twice, only less room)
  }
  std::lock_guard<std::mutex> registry(g_registry_mu);
  for (const RegistryEntry& e : g_registry) {
    const int here = e.pool ? index_on(e.pool, &dev) : -1;
    if (here < 0) continue;
    set_lost(e.pool, false, [&](int resident, uintptr_t base, size_t len) {
      uint64_t off = 0;
      if (resident != here || dev.offset_of(reinterpret_cast<void*>(base), &off) != CXLPOOL_OK) return false;
      auto it = std::upper_bound(online.begin(), online.end(), off,
                                 [](uint64_t o, const Device::Extent& x) { return o < x.hi; });
      return it != online.end() && it->lo <= off && off + len <= it->hi;
    });
  }
}

// A forced release: like withdraw_locked, but every unit that can move does and the range goes
// whatever still holds it; the rest is lost (Device::force_withdraw) and listed in *lost.
// failure (non-null): the memory behind the range is gone, said there; nothing of it is read
// (nothing moves), written or freed, and what held it gets fresh zeroed memory.
cxlpool_status_t force_locked(Device& dev, uint64_t lo, uint64_t hi, CapacityReport* report,
                              std::vector<LostRange>* lost, std::string* message,
                              const std::string* failure = nullptr) {
  const char* what = failure ? "loss" : "forced release";
  if (!failure) report->trimmed_bytes += trim_pools_on(dev);
  DeviceError err;
  if (cxlpool_status_t s = dev.begin_withdraw(lo, hi, &err)) {
    say(message, extent_failure(dev, what, lo, hi - lo, err));
    return s;
  }
  Outcome o;
  if (!failure) {
    evacuate(dev, /*all_or_nothing=*/false, &o);
    report->evacuated_units += o.units;
    report->evacuated_bytes += o.bytes;
  }
  std::vector<Device::Lost> gone;
  cxlpool_status_t s = dev.force_withdraw(&gone, &err, failure != nullptr);
  if (s == CXLPOOL_E_NO_MEMORY || s == CXLPOOL_E_INVALID_ARGUMENT) {
    dev.end_withdraw(false, nullptr);
    say(message, extent_failure(dev, what, lo, hi - lo, err));
    return s;
  }
  for (const Device::Lost& x : gone) mark_lost(x);
  std::string text = "device '" + dev.name() + "': " +
                     (failure ? "the memory of " + format_bytes(hi - lo) + " at offset " + format_hex(lo) +
                                    " is gone (" + *failure + ")"
                              : "forced release of " + format_bytes(hi - lo) + " at offset " + format_hex(lo)) +
                     ": ";
  if (gone.empty()) text += "nothing was lost";
  for (size_t i = 0; i < gone.size(); ++i) {
    const Device::Lost& x = gone[i];
    LostRange l;
    l.device = dev.name();
    l.addr = x.addr;
    l.len = x.len;
    l.committed = x.committed;
    l.holder = holder_of(x);
    l.contents_kept = x.contents_kept;
    ++report->lost_units;
    report->lost_bytes += x.committed;
    if (i < 8)
      text += std::string(i ? "; " : "") + "lost " + format_bytes(x.committed) + " committed at " + format_hex(x.addr) +
              "+" + format_hex(x.len) + " of " + l.holder +
              (x.contents_kept ? " (contents undefined: they could not be zeroed)" : " (reads as zeros now)");
    else if (i == 8)
      text += "; and " + std::to_string(gone.size() - 8) + " more";
    lost->push_back(std::move(l));
  }
  if (!gone.empty() && !o.first_refusal.empty()) text += "; it could not move: " + o.first_refusal;
  if (dev.committed() > dev.capacity())
    text += "; " + format_bytes(dev.committed() - dev.capacity()) +
            " committed above the capacity now (new commits on the device wait for frees)";
  if (s == CXLPOOL_E_OS) text += "; " + extent_failure(dev, what, lo, hi - lo, err);
  say(message, text);
  if (!gone.empty()) os::prim::write_stderr(("cxlpool: " + text + "\n").c_str());
  return s;
}

template <class F>
cxlpool_status_t guarded(std::string* message, F&& f) noexcept {
  try {
    return f();
  } catch (const Failure& e) {
    say(message, e.what());
    return e.status();
  } catch (const std::bad_alloc&) {
    say(message, "out of memory");
    return CXLPOOL_E_NO_MEMORY;
  } catch (const std::exception& e) {
    say(message, e.what());
    return CXLPOOL_E_INTERNAL;
  }
}

}  // namespace

std::shared_ptr<Device> find_device(const std::string& name, cxlpool_status_t* status, std::string* message) {
  *status = CXLPOOL_E_NOT_FOUND;
  size_t matches = 0;
  std::shared_ptr<Device> dev = registry::find(name, &matches);
  if (!dev && matches == 0)
    if (std::shared_ptr<registry::SharedDevice> shared = registry::find_shared(name)) {
      *status = CXLPOOL_E_BUSY;
      say(message, "device '" + name + "' holds the shared pool '" + shared->location +
                       "' this process has open: every participant maps all of a shared pool, so its capacity is "
                       "its size, fixed when it was created; capacity moves between its participants by quotas");
      return nullptr;
    }
  if (!dev)
    say(message, "device '" + name +
                     "' is not open in this process (capacity changes apply to the devices its "
                     "pools and backings use)");
  if (matches > 1) {
    say(message, "device '" + name + "': " + std::to_string(matches) +
                     " open devices have that name (targets of different topologies); close all but one");
    *status = CXLPOOL_E_BUSY;
    return nullptr;
  }
  return dev;
}

void elastic_reset_after_fork() noexcept {
  new (&g_elastic_mu) std::mutex();
  new (&g_lost_mu) std::mutex();
}

void set_pin_check(PinCheck check) noexcept { g_pin_check.store(check, std::memory_order_release); }

void set_outside_moves(OutsideMoveBegin begin, OutsideMoveEnd end) noexcept {
  g_outside_end.store(end, std::memory_order_release);
  g_outside_begin.store(begin, std::memory_order_release);
}

namespace {

// One capacity change of the device named name: looked up, serialised with every other, its
// report filled around body (which sees the report with capacity_before and capacity_after
// set to the capacity now).
template <class Body>
cxlpool_status_t change(const std::string& name, CapacityReport* report, std::string* message, Body&& body) noexcept {
  return guarded(message, [&] {
    CapacityReport local;
    CapacityReport& r = report ? *report : local;
    r = CapacityReport{};
    cxlpool_status_t missing = CXLPOOL_OK;
    std::shared_ptr<Device> dev = find_device(name, &missing, message);
    if (!dev && missing == CXLPOOL_E_BUSY)
      if (std::shared_ptr<registry::SharedDevice> shared = registry::find_shared(name))
        r.capacity_before = r.capacity_after = shared->ledger.capacity.load();
    if (!dev) return missing;
    std::lock_guard<std::mutex> serial(g_elastic_mu);
    r.capacity_before = r.capacity_after = dev->capacity();
    const uint64_t relocated = dev->ledger().elastic.relocated.load();
    const cxlpool_status_t s = body(*dev, r);
    r.relocated = dev->ledger().elastic.relocated.load() - relocated;
    r.capacity_after = dev->capacity();
    return s;
  });
}

}  // namespace

cxlpool_status_t device_add_extent(const std::string& name, uint64_t offset, uint64_t length, CapacityReport* report,
                                   std::string* message) noexcept {
  return change(name, report, message, [&](Device& dev, CapacityReport& r) {
    if (cxlpool_status_t bad = check_extent(dev, "add", offset, length, message)) return bad;
    if (std::string why = past_node_memory(dev, dev.capacity() + length, offset + length); !why.empty()) {
      say(message, "device '" + name + "': add extent: " + why);
      return CXLPOOL_E_CAPACITY;
    }
    DeviceError err;
    cxlpool_status_t s = dev.add_extent(offset, offset + length, &err);
    if (s) {
      say(message, extent_failure(dev, "add", offset, length, err));
    } else {
      unmark_regained(dev);
      return_home(dev, &r);
    }
    return s;
  });
}

cxlpool_status_t device_withdraw_extent(const std::string& name, uint64_t offset, uint64_t length,
                                        CapacityReport* report, std::string* message) noexcept {
  return change(name, report, message, [&](Device& dev, CapacityReport& r) {
    if (cxlpool_status_t bad = check_extent(dev, "withdraw", offset, length, message)) return bad;
    return withdraw_locked(dev, offset, offset + length, &r, message);
  });
}

namespace {

// Grows dev to capacity: holes of the offset space first (extents withdrawn before), then past
// its end; units a withdrawal moved off the device then go home.
cxlpool_status_t grow_to_locked(Device& dev, uint64_t capacity, CapacityReport& r, std::string* message) {
  // Holes of the offset space fill first: it ends past where it does only by what they lack.
  if (std::string why = past_node_memory(dev, capacity, std::max(capacity, dev.space())); !why.empty()) {
    say(message, "device '" + dev.name() + "': grow: " + why);
    return CXLPOOL_E_CAPACITY;
  }
  cxlpool_status_t s = CXLPOOL_OK;
  DeviceError err;
  uint64_t want = capacity - std::min(capacity, dev.capacity()), at = 0;
  std::vector<Device::Extent> online = dev.online_extents();
  online.push_back({dev.space(), dev.space()});
  for (const Device::Extent& e : online) {
    if (!want) break;
    const uint64_t hole_end = e.lo == e.hi ? at + want : e.lo;
    if (hole_end > at) {
      const uint64_t take = std::min(want, hole_end - at);
      if ((s = dev.add_extent(at, at + take, &err))) {
        say(message, extent_failure(dev, "grow", at, take, err));
        break;
      }
      want -= take;
    }
    at = e.hi;
  }
  if (s == CXLPOOL_OK) {
    unmark_regained(dev);
    return_home(dev, &r);
  }
  return s;
}

// Shrinks dev to capacity from the top (the offsets the first-fit allocator handed out last):
// withdrawals, or forced releases (what cannot move is lost, listed in *lost).
cxlpool_status_t shrink_to_locked(Device& dev, uint64_t capacity, bool force, CapacityReport& r,
                                  std::vector<LostRange>* lost, std::string* message) {
  cxlpool_status_t s = CXLPOOL_OK;
  while (s == CXLPOOL_OK && dev.capacity() > capacity) {
    std::vector<Device::Extent> online = dev.online_extents();
    if (online.empty()) break;
    const Device::Extent top = online.back();
    const uint64_t take = std::min(dev.capacity() - capacity, top.hi - top.lo);
    s = force ? force_locked(dev, top.hi - take, top.hi, &r, lost, message)
              : withdraw_locked(dev, top.hi - take, top.hi, &r, message);
  }
  return s;
}

}  // namespace

cxlpool_status_t device_resize(const std::string& name, uint64_t capacity, CapacityReport* report,
                               std::string* message) noexcept {
  return change(name, report, message, [&](Device& dev, CapacityReport& r) {
    const uint64_t ps = dev.caps().page_size;
    if (capacity % ps || capacity < kMinDeviceBytes) {
      say(message, "device '" + name + "': a capacity must be a multiple of its page size (" + format_bytes(ps) +
                       ") and at least " + format_bytes(kMinDeviceBytes) + "; " + std::to_string(capacity) + " is not");
      return CXLPOOL_E_INVALID_ARGUMENT;
    }
    return capacity > r.capacity_before ? grow_to_locked(dev, capacity, r, message)
                                        : shrink_to_locked(dev, capacity, false, r, nullptr, message);
  });
}

cxlpool_status_t device_follow(Device& dev, uint64_t capacity, CapacityReport* report, std::vector<LostRange>* lost,
                               std::string* message) noexcept {
  return guarded(message, [&] {
    CapacityReport local;
    CapacityReport& r = report ? *report : local;
    r = CapacityReport{};
    std::lock_guard<std::mutex> serial(g_elastic_mu);
    r.capacity_before = dev.capacity();
    capacity -= capacity % dev.caps().page_size;
    cxlpool_status_t s = capacity > r.capacity_before ? grow_to_locked(dev, capacity, r, message)
                                                      : shrink_to_locked(dev, capacity, true, r, lost, message);
    r.capacity_after = dev.capacity();
    return s;
  });
}

void set_lost_handler(LostHandler handler, void* ctx) noexcept {
  std::lock_guard<std::mutex> lock(g_lost_mu);
  g_lost_handler = handler;
  g_lost_ctx = ctx;
}

cxlpool_status_t device_offer_extents(const std::string& name, const std::vector<Device::Extent>& extents,
                                      std::vector<cxlpool_status_t>* verdicts, CapacityReport* report,
                                      std::string* message) noexcept {
  return change(name, report, message, [&](Device& dev, CapacityReport& r) {
    verdicts->assign(extents.size(), CXLPOOL_OK);
    cxlpool_status_t first = CXLPOOL_OK;
    std::string rejected;
    size_t accepted = 0;
    for (size_t i = 0; i < extents.size(); ++i) {
      const uint64_t offset = extents[i].lo, length = extents[i].hi - extents[i].lo;
      std::string why;
      cxlpool_status_t s =
          extents[i].hi < extents[i].lo ? CXLPOOL_E_INVALID_ARGUMENT : check_extent(dev, "offer", offset, length, &why);
      if (extents[i].hi < extents[i].lo) why = "extent end before its start";
      if (s == CXLPOOL_OK) {
        why = past_node_memory(dev, dev.capacity() + length, offset + length);
        if (!why.empty()) s = CXLPOOL_E_CAPACITY;
      }
      if (s == CXLPOOL_OK) {
        DeviceError err;
        if ((s = dev.add_extent(offset, offset + length, &err)))
          why = extent_failure(dev, "offer", offset, length, err);
      }
      (*verdicts)[i] = s;
      if (s == CXLPOOL_OK) {
        ++accepted;
        continue;
      }
      if (first == CXLPOOL_OK) first = s;
      rejected += "; extent #" + std::to_string(i) + " rejected: " + why;
    }
    if (accepted) {
      unmark_regained(dev);
      return_home(dev, &r);
    }
    if (first != CXLPOOL_OK)
      say(message, "device '" + name + "': offer of " + std::to_string(extents.size()) + " extent" +
                       (extents.size() == 1 ? "" : "s") + ": " + std::to_string(accepted) + " accepted" + rejected);
    return first;
  });
}

namespace {

void tell_lost_handler(const std::vector<LostRange>& gone) noexcept {
  LostHandler handler = nullptr;
  void* ctx = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_lost_mu);
    handler = g_lost_handler;
    ctx = g_lost_ctx;
  }
  if (handler)
    for (const LostRange& l : gone) handler(l.device.c_str(), reinterpret_cast<void*>(l.addr), l.len, l.committed, ctx);
}

}  // namespace

cxlpool_status_t device_release_extent(const std::string& name, uint64_t offset, uint64_t length, uint64_t deadline_ms,
                                       bool force, CapacityReport* report, std::vector<LostRange>* lost,
                                       std::string* message) noexcept {
  std::vector<LostRange> local;
  std::vector<LostRange>& gone = lost ? *lost : local;
  CapacityReport total;
  cxlpool_status_t s = CXLPOOL_OK;
  try {
    gone.clear();
    const uint64_t deadline = os::monotonic_ns() + std::min<uint64_t>(deadline_ms, uint64_t(1) << 40) * 1000000;
    unsigned pause_ms = 10;
    for (;;) {
      const bool last = os::monotonic_ns() >= deadline;
      const bool forcing = force && last;
      CapacityReport r;
      bool found = false;  // not: a refusal that waiting cannot change (a shared pool's device)
      s = change(name, &r, message, [&](Device& dev, CapacityReport& rr) {
        found = true;
        if (cxlpool_status_t bad = check_extent(dev, "release", offset, length, message)) return bad;
        // A forced release forces only what a plain withdrawal cannot have: the counters
        // (forced) then say what was taken by force, whatever the deadline.
        cxlpool_status_t plain = withdraw_locked(dev, offset, offset + length, &rr, message);
        return plain == CXLPOOL_E_BUSY && forcing ? force_locked(dev, offset, offset + length, &rr, &gone, message)
                                                  : plain;
      });
      if (total.attempts++ == 0) total.capacity_before = r.capacity_before;
      total.capacity_after = r.capacity_after;
      total.trimmed_bytes += r.trimmed_bytes;
      total.relocated += r.relocated;
      total.evacuated_units += r.evacuated_units;
      total.evacuated_bytes += r.evacuated_bytes;
      total.lost_units += r.lost_units;
      total.lost_bytes += r.lost_bytes;
      if (s != CXLPOOL_E_BUSY || forcing || !found) break;
      if (last) {
        if (deadline_ms && message)
          *message = "still held at the deadline (" + std::to_string(total.attempts) + " attempts in " +
                     std::to_string(deadline_ms) + " ms): " + *message;
        break;
      }
      const uint64_t now = os::monotonic_ns();
      const uint64_t left_ms = now < deadline ? (deadline - now + 999999) / 1000000 : 0;
      os::prim::sleep_ms(unsigned(std::min<uint64_t>(pause_ms, left_ms)));
      pause_ms = std::min(pause_ms * 2, 500u);
    }
  } catch (const std::bad_alloc&) {
    say(message, "out of memory");
    s = CXLPOOL_E_NO_MEMORY;
  }
  if (s == CXLPOOL_OK && total.lost_units == 0 && message) message->clear();  // earlier attempts' refusals
  if (report) *report = total;
  tell_lost_handler(gone);
  return s;
}

cxlpool_status_t device_lose_extent(const std::string& name, uint64_t offset, uint64_t length,
                                    const std::string& failure, CapacityReport* report, std::vector<LostRange>* lost,
                                    std::string* message) noexcept {
  std::vector<LostRange> local;
  std::vector<LostRange>& gone = lost ? *lost : local;
  cxlpool_status_t s = CXLPOOL_OK;
  try {
    gone.clear();
    s = change(name, report, message, [&](Device& dev, CapacityReport& r) {
      if (cxlpool_status_t bad = check_extent(dev, "loss", offset, length, message)) return bad;
      return force_locked(dev, offset, offset + length, &r, &gone, message, &failure);
    });
  } catch (const std::bad_alloc&) {
    say(message, "out of memory");
    s = CXLPOOL_E_NO_MEMORY;
  }
  tell_lost_handler(gone);
  return s;
}

}  // namespace cxlpool::detail::alloc
