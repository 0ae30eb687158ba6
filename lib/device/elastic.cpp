// SPDX-License-Identifier: MIT
// Elastic capacity of one device (device.hpp, docs/devices.md): extents of its offset space
// added while pools allocate from it, and withdrawn in three steps: begin (capacity drops,
// free offsets are withheld, bookkeeping-only ranges take other offsets), the allocator's
// evacuation of what still holds the range (alloc/elastic.cpp), end (the range's memory is
// freed, or the range comes back). Everything here runs under the device's lock.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "device/device.hpp"
#include "os/prim.hpp"

namespace cxlpool::detail {

namespace {

cxlpool_status_t status_of(int e) noexcept {
  return e == ENOSPC || e == EDQUOT || e == EFBIG ? CXLPOOL_E_CAPACITY
         : e == ENOMEM                            ? CXLPOOL_E_NO_MEMORY
         : e == EACCES || e == EPERM              ? CXLPOOL_E_PERMISSION
                                                  : CXLPOOL_E_OS;
}

bool overlaps(uint64_t a_lo, uint64_t a_hi, uint64_t b_lo, uint64_t b_hi) noexcept {
  return a_lo < b_hi && b_lo < a_hi;
}

}  // namespace

std::vector<Device::Extent> Device::online_extents() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Extent> out;
  online_.for_each([&](uint64_t lo, uint64_t hi) { out.push_back({lo, hi}); });
  return out;
}

uint64_t Device::space() const {
  std::lock_guard<std::mutex> lock(mu_);
  return space_;
}

std::vector<std::shared_ptr<Storage>> Device::offset_storages() const {
  std::vector<std::shared_ptr<Storage>> out;
  auto add = [&](const std::shared_ptr<Storage>& s) {
    if (s && !s->anonymous() && std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  };
  add(private_storage_);
  add(shared_storage_);
  for (auto& [a, r] : reservations_) add(r.storage);
  return out;
}

int Device::conform(Storage& s) noexcept {
  if (s.anonymous()) return 0;
  if (int e = s.grow_to(space_)) return e;
  // Its offsets are the online extents (it was made with the capacity at open), less the
  // withdrawal in progress.
  const IntervalSet none;
  online_.for_each([&](uint64_t lo, uint64_t hi) { s.restore(lo, hi, none); });
  bool ok = true;
  online_.for_each_gap(0, std::max<uint64_t>(space_, s.size()),
                       [&](uint64_t lo, uint64_t hi) { ok &= s.withhold(lo, hi); });
  if (withdrawing_.hi > withdrawing_.lo) {
    ok &= s.withhold(withdrawing_.lo, withdrawing_.hi);
    try {
      bool listed = false;
      for (auto& held : withheld_in_) listed |= held.get() == &s;
      for (auto* slot : {&private_storage_, &shared_storage_})
        if (!listed && slot->get() == &s) {
          withheld_in_.push_back(*slot);
          listed = true;
        }
    } catch (...) {
      ok = false;
    }
  }
  return ok ? 0 : ENOMEM;
}

cxlpool_status_t Device::add_extent(uint64_t lo, uint64_t hi, DeviceError* err) noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (private_storage_ && private_storage_->borrowed())
      return device_failure(err, CXLPOOL_E_NOT_SUPPORTED, 0,
                            "add extent: the device's capacity is borrowed from its shared pool as the device needs "
                            "it, within its quota's grant (cxlpool-compose grant)");
  }
  return add_range(lo, hi, err);
}

cxlpool_status_t Device::add_range(uint64_t lo, uint64_t hi, DeviceError* err) noexcept {
  const size_t ps = caps_.page_size;
  if (hi <= lo || lo % ps || hi % ps) return device_failure(err, CXLPOOL_E_INVALID_ARGUMENT, 0, "add extent: range");
  std::lock_guard<std::mutex> lock(mu_);
  if (online_.covered(lo, hi) || overlaps(lo, hi, withdrawing_.lo, withdrawing_.hi))
    return device_failure(err, CXLPOOL_E_INVALID_ARGUMENT, 0, "add extent: online already");
  if (hi > max_space_)
    return device_failure(err, CXLPOOL_E_CAPACITY, 0, "add extent: past the device's end", max_space_);
  // Every file can hold the extent before any of it is handed out.
  std::vector<std::shared_ptr<Storage>> storages;
  try {
    storages = offset_storages();
  } catch (...) {
    return device_failure(err, CXLPOOL_E_NO_MEMORY, ENOMEM, "add extent: storages");
  }
  for (auto& st : storages)
    if (!st->retired())
      if (int e = st->grow_to(hi)) return device_failure(err, status_of(e), e, "add extent: ftruncate");
  try {
    online_.insert(lo, hi);
  } catch (...) {
    return device_failure(err, CXLPOOL_E_NO_MEMORY, ENOMEM, "add extent: extent table");
  }
  // Offsets a forced release left to the reservations that held them stay theirs.
  for (auto& st : storages)
    if (!st->retired()) {
      try {
        st->restore(lo, hi, held_in(st.get(), lo, hi));
      } catch (...) {
        // Out of host memory for the table: the extent's offsets stay withheld (online, unused).
      }
    }
  space_ = std::max(space_, hi);
  ledger_.capacity.fetch_add(hi - lo, std::memory_order_relaxed);
  ledger_.elastic.grows.fetch_add(1, std::memory_order_relaxed);
  return CXLPOOL_OK;
}

bool Device::grow_on_request(uint64_t bytes) noexcept {
  const Provider::AddRange add = [](void* self, uint64_t lo, uint64_t hi) {
    return static_cast<Device*>(self)->add_range(lo, hi, nullptr) == CXLPOOL_OK;
  };
  char why[sizeof grow_refusal_] = "";
  if (provider_->grow(spec_, bytes, add, this, why, sizeof why)) return true;
  std::lock_guard<std::mutex> lock(mu_);
  std::memcpy(grow_refusal_, why, sizeof why);
  grow_refusal_[sizeof grow_refusal_ - 1] = 0;
  return false;
}

void Device::grow_refusal(char* out, size_t len) const noexcept {
  if (!len) return;
  std::lock_guard<std::mutex> lock(mu_);
  const size_t n = std::min(len - 1, std::strlen(grow_refusal_));
  std::memcpy(out, grow_refusal_, n);
  out[n] = 0;
}

uint64_t Device::online_in(uint64_t lo, uint64_t hi) const {
  std::lock_guard<std::mutex> lock(mu_);
  return online_.covered(lo, hi) + (overlaps(lo, hi, withdrawing_.lo, withdrawing_.hi) ? 1 : 0);
}

bool Device::range_unreserved(uint64_t lo, uint64_t hi) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (overlaps(lo, hi, withdrawing_.lo, withdrawing_.hi)) return false;
  for (auto& [a, r] : reservations_)
    if (!r.storage->anonymous() && overlaps(lo, hi, r.offset, r.offset + r.size)) return false;
  return true;
}

const void* Device::provider_state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return private_storage_ ? private_storage_->provider_state() : nullptr;
}

bool Device::holds_withdrawn(const Reservation& r, uint64_t* lo, uint64_t* hi) const noexcept {
  if (withdrawing_.hi <= withdrawing_.lo || r.arriving || r.storage->anonymous()) return false;
  if (!overlaps(r.offset, r.offset + r.size, withdrawing_.lo, withdrawing_.hi)) return false;
  *lo = std::max(r.offset, withdrawing_.lo);
  *hi = std::min(r.offset + r.size, withdrawing_.hi);
  return true;
}

bool Device::relocate_bookkeeping(Reservation& r) noexcept {
  if (r.sharing != Sharing::kPrivate || !r.owns_range || r.leaving || r.arriving || mapped_shared(r) ||
      !r.storage->private_anonymous() || r.storage->retired())
    return false;
  Storage& st = *r.storage;
  uint64_t off = 0, largest = 0;
  if (st.take_mappable_range(r.size, size_t(2) << 20, &off, &largest)) return false;
  try {
    IntervalSet moved;
    committed_in(r).for_each(
        [&](uint64_t lo, uint64_t hi) { moved.insert(off + (lo - r.offset), off + (hi - r.offset)); });
    moved.for_each([&](uint64_t lo, uint64_t hi) { st.committed.insert(lo, hi); });
    st.committed.erase(r.offset, r.offset + r.size);
  } catch (...) {
    // Out of host memory for the interval tables: the range keeps its offsets (an occupant).
    st.give_back_range(off, r.size);
    return false;
  }
  st.give_back_range(r.offset, r.size);
  r.offset = off;
  return true;
}

cxlpool_status_t Device::begin_withdraw(uint64_t lo, uint64_t hi, DeviceError* err) noexcept {
  const size_t ps = caps_.page_size;
  if (hi <= lo || lo % ps || hi % ps) return device_failure(err, CXLPOOL_E_INVALID_ARGUMENT, 0, "withdraw: range");
  std::lock_guard<std::mutex> lock(mu_);
  if (withdrawing_.hi > withdrawing_.lo)
    return device_failure(err, CXLPOOL_E_BUSY, 0, "withdraw: another withdrawal is in progress");
  if (online_.covered(lo, hi) != hi - lo)
    return device_failure(err, CXLPOOL_E_INVALID_ARGUMENT, 0, "withdraw: not online");
  try {
    withheld_in_ = offset_storages();
  } catch (...) {
    return device_failure(err, CXLPOOL_E_NO_MEMORY, ENOMEM, "withdraw: storages");
  }
  withdrawing_ = {lo, hi};
  ledger_.capacity.fetch_sub(hi - lo, std::memory_order_relaxed);
  for (auto& st : withheld_in_)
    if (!st->withhold(lo, hi)) {
      cancel_withdraw_locked();  // gives back exactly what no reservation holds
      return device_failure(err, CXLPOOL_E_NO_MEMORY, ENOMEM, "withdraw: offset table");
    }
  for (auto& [a, r] : reservations_) {
    uint64_t l = 0, h = 0;
    if (holds_withdrawn(r, &l, &h) && relocate_bookkeeping(r))
      ledger_.elastic.relocated.fetch_add(1, std::memory_order_relaxed);
  }
  return CXLPOOL_OK;
}

std::vector<Device::Occupant> Device::occupants() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Occupant> out;
  for (auto& [a, r] : reservations_) {
    Occupant o;
    if (!holds_withdrawn(r, &o.lo, &o.hi)) continue;
    o.addr = r.addr;
    o.size = r.size;
    o.client = r.client;
    o.shared = r.sharing == Sharing::kShared || r.inherited;
    o.mapped = !r.owns_range;
    out.push_back(o);
  }
  return out;
}

IntervalSet Device::held_in(const Storage* st, uint64_t lo, uint64_t hi) const {
  IntervalSet in_use;
  for (auto& [a, r] : reservations_)
    if (r.storage.get() == st && r.owns_range && overlaps(r.offset, r.offset + r.size, lo, hi))
      in_use.insert(std::max(r.offset, lo), std::min(r.offset + r.size, hi));
  return in_use;
}

void Device::cancel_withdraw_locked() noexcept {
  const uint64_t lo = withdrawing_.lo, hi = withdrawing_.hi;
  for (auto& st : withheld_in_) {
    IntervalSet in_use;
    try {
      in_use = held_in(st.get(), lo, hi);
    } catch (...) {
      continue;  // out of host memory: those offsets stay withheld, nothing is handed out twice
    }
    st->restore(lo, hi, in_use);
  }
  withheld_in_.clear();
  withdrawing_ = {0, 0};
  ledger_.capacity.fetch_add(hi - lo, std::memory_order_relaxed);
}

cxlpool_status_t Device::end_withdraw(bool finish, DeviceError* err) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t lo = withdrawing_.lo, hi = withdrawing_.hi;
  if (hi <= lo) return device_failure(err, CXLPOOL_E_INVALID_ARGUMENT, 0, "withdraw: none in progress");
  if (!finish) {
    cancel_withdraw_locked();
    ledger_.elastic.refusals.fetch_add(1, std::memory_order_relaxed);
    return CXLPOOL_OK;
  }
  uint64_t held = 0;
  for (auto& [a, r] : reservations_) {
    uint64_t l = 0, h = 0;
    held += holds_withdrawn(r, &l, &h);
  }
  if (held) return device_failure(err, CXLPOOL_E_BUSY, 0, "withdraw: reservations hold part of the range", held);
  if (committed() > capacity())
    return device_failure(err, CXLPOOL_E_BUSY, 0, "withdraw: committed above the capacity", committed());
  try {
    online_.erase(lo, hi);
  } catch (...) {
    return device_failure(err, CXLPOOL_E_NO_MEMORY, ENOMEM, "withdraw: extent table");
  }
  uint64_t end = 0;
  online_.for_each([&](uint64_t, uint64_t h) { end = h; });
  int first_error = 0;
  for (auto& st : withheld_in_)
    if (!st->retired())  // a fork child's view of its parent's storage is the parent's to free
      if (int e = st->drop_range(lo, hi, end); e && !first_error) first_error = e;
  if (hi >= space_) space_ = end;
  withheld_in_.clear();
  withdrawing_ = {0, 0};
  ledger_.elastic.shrinks.fetch_add(1, std::memory_order_relaxed);
  // The range is gone either way; a file whose pages could not be punched out keeps them
  // until the device closes (said, not hidden).
  if (first_error) return device_failure(err, CXLPOOL_E_OS, first_error, "withdraw: fallocate(PUNCH_HOLE)");
  return CXLPOOL_OK;
}

cxlpool_status_t Device::force_withdraw(std::vector<Lost>* lost, DeviceError* err, bool backing_gone) noexcept {
  std::unique_lock<std::mutex> lock(mu_);
  if (withdrawing_.hi <= withdrawing_.lo)
    return device_failure(err, CXLPOOL_E_INVALID_ARGUMENT, 0, "withdraw: none in progress");
  // A move out of the range copies its bytes now: they must not be punched out under it.
  for (;;) {
    bool moving = false;
    for (auto& [a, r] : reservations_) {
      uint64_t l = 0, h = 0;
      moving |= r.leaving && holds_withdrawn(r, &l, &h);
    }
    if (!moving) break;
    moved_.wait(lock);
  }
  const uint64_t lo = withdrawing_.lo, hi = withdrawing_.hi;
  try {
    lost->clear();
    for (auto& [a, r] : reservations_) {
      uint64_t l = 0, h = 0;
      if (!holds_withdrawn(r, &l, &h)) continue;
      Lost x;
      x.base = r.addr;
      x.addr = r.addr + (l - r.offset);
      x.len = h - l;
      x.committed = r.storage->committed.covered(l, h);
      x.client = r.client;
      x.shared = r.sharing == Sharing::kShared || r.inherited;
      x.mapped = !r.owns_range;
      lost->push_back(x);
    }
    online_.erase(lo, hi);
  } catch (...) {
    return device_failure(err, CXLPOOL_E_NO_MEMORY, ENOMEM, "withdraw: extent table");
  }
  // The files keep every offset a reservation still maps (a mapping past a file's end is
  // SIGBUS at the next touch); the offsets themselves are never handed out again.
  uint64_t end = 0;
  online_.for_each([&](uint64_t, uint64_t h) { end = h; });
  for (auto& [a, r] : reservations_)
    if (!r.arriving && !r.storage->anonymous()) end = std::max(end, r.offset + r.size);
  // Committed pages a lost reservation maps shared stay in the file, zeroed in place: punched
  // out, the next touch would have the filesystem find a page again (SIGBUS when it is full,
  // and storage taken back at offline offsets). The rest of the range is freed. Private pages
  // are anonymous memory the file does not reach: discarded, they read as zeros too. Device
  // DAX can neither punch nor is zeroed here: its bytes stay, undefined.
  int first_error = 0;
  bool punch_nothing = false;
  std::vector<std::pair<const Storage*, IntervalSet>> kept;
  try {
    for (Lost& x : *lost) {
      Reservation* r = find(reinterpret_cast<const void*>(x.base), 1);
      if (!r) continue;
      if (!mapped_shared(*r)) {
        x.contents_kept = os::prim::advise_dontneed(reinterpret_cast<void*>(x.addr), x.len) != 0;
        continue;
      }
      Storage& st = *r->storage;
      if (backing_gone && !r->inherited) {
        x.contents_kept = !replace_lost(*r, x);
        continue;
      }
      // Device DAX cannot be zeroed here; a fork child's view of its parent's shared memory is
      // the parent's to lose, not this process's: both keep their bytes, undefined.
      if (!st.resizable() || st.retired() || r->inherited) {
        x.contents_kept = true;
        continue;
      }
      const uint64_t l = r->offset + (x.addr - r->addr), h = l + x.len;
      IntervalSet* keep = nullptr;
      for (auto& [s, set] : kept)
        if (s == &st) keep = &set;
      if (!keep) keep = &kept.emplace_back(&st, IntervalSet()).second;
      const int fd = st.valid_fd();
      st.committed.for_each_in(l, h, [&](uint64_t a, uint64_t b) {
        keep->insert(a, b);
        // A filesystem that takes no write(2) (hugetlbfs) keeps the bytes: undefined, said.
        if (fd < 0 || os::prim::zero_range(fd, a, b - a) != 0) x.contents_kept = true;
      });
    }
  } catch (...) {
    // Out of host memory for the tables: nothing of the range is punched (its memory stays
    // until the device closes), so nothing can fault.
    punch_nothing = true;
  }
  for (auto& st : withheld_in_) {
    if (st->retired() || punch_nothing || backing_gone) continue;
    const IntervalSet* keep = nullptr;
    for (auto& [s, set] : kept)
      if (s == st.get()) keep = &set;
    auto drop = [&](uint64_t a, uint64_t b) {
      if (int e = st->drop_range(a, b, end); e && !first_error) first_error = e;
    };
    if (keep)
      keep->for_each_gap(lo, hi, drop);
    else
      drop(lo, hi);
  }
  if (hi >= space_) space_ = end;
  withheld_in_.clear();
  withdrawing_ = {0, 0};
  uint64_t bytes = 0;
  for (const Lost& x : *lost) bytes += x.committed;
  ledger_.elastic.shrinks.fetch_add(1, std::memory_order_relaxed);
  ledger_.elastic.forced.fetch_add(1, std::memory_order_relaxed);
  ledger_.elastic.lost_units.fetch_add(lost->size(), std::memory_order_relaxed);
  ledger_.elastic.lost_bytes.fetch_add(bytes, std::memory_order_relaxed);
  if (first_error) return device_failure(err, CXLPOOL_E_OS, first_error, "withdraw: fallocate(PUNCH_HOLE)");
  return CXLPOOL_OK;
}

void Device::note_evacuated(uint64_t units, uint64_t bytes) noexcept {
  ledger_.elastic.evacuated_units.fetch_add(units, std::memory_order_relaxed);
  ledger_.elastic.evacuated_bytes.fetch_add(bytes, std::memory_order_relaxed);
}

}  // namespace cxlpool::detail
