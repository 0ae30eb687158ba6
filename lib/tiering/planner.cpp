// SPDX-License-Identifier: MIT
// The tiering planner (planner.hpp): the hot/cold policy over plain structs; moves go out to
// an Executor one at a time and their outcomes come back into the inputs.
#include "tiering/planner.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

namespace cxlpool::detail::tiering::planner {

int first_of_tier(const Pool& p, int tier) noexcept {
  for (size_t di = 0; di < p.devices.size(); ++di)
    if (p.devices[di].tier == tier) return int(di);
  return -1;
}

int first_of_tier_with_room(const Pool& p, const std::vector<Device>& devices, int tier, uint64_t bytes) noexcept {
  for (size_t di = 0; di < p.devices.size(); ++di)
    if (p.devices[di].tier == tier && devices[size_t(p.devices[di].device)].room.fits(bytes)) return int(di);
  return -1;
}

namespace {

class Step {
 public:
  Step(Input& in, Executor& exec) : in_(in), exec_(exec) {}

  Summary run() {
    move_pinned();
    by_fast_device();
    return sum_;
  }

 private:
  struct Fast {
    int di = -1;  // device of the pool
    int tier = 0;
  };

  const Pool& pool(const Unit& u) const { return in_.pools[size_t(u.pool)]; }
  int tier(const Unit& u, int di) const { return pool(u).devices[size_t(di)].tier; }
  int device(const Unit& u, int di) const { return pool(u).devices[size_t(di)].device; }
  Device& dev(const Unit& u, int di) { return in_.devices[size_t(device(u, di))]; }

  // The pool's fastest device with the most room.
  Fast fastest(const Pool& p) const {
    Fast f;
    uint64_t best_room = 0;
    for (size_t di = 0; di < p.devices.size(); ++di) {
      const uint64_t room = in_.devices[size_t(p.devices[di].device)].room.free();
      const int t = p.devices[di].tier;
      if (f.di < 0 || t < f.tier || (t == f.tier && room > best_room)) {
        f = {int(di), t};
        best_room = room;
      }
    }
    return f;
  }

  // Where a demoted unit goes: its home when that is slower, else the next slower device
  // with room.
  int demotion_target(const Unit& u, int fast_tier) const {
    if (tier(u, u.home) > fast_tier) return u.home;
    const Pool& p = pool(u);
    int best = -1;
    for (size_t di = 0; di < p.devices.size(); ++di) {
      const int t = p.devices[di].tier;
      if (t <= fast_tier) continue;
      if (!in_.devices[size_t(p.devices[di].device)].room.fits(u.committed)) continue;
      if (best < 0 || t < p.devices[size_t(best)].tier) best = int(di);
    }
    return best;
  }

  bool settled(const Unit& u) const {
    return (u.moved_at && in_.now - u.moved_at < in_.policy.min_residence_ns) || in_.now < u.refused_until;
  }

  // NUMA node to NUMA node under kernel=respect while the kernel tiers: the kernel's move.
  bool kernel_owns(const Unit& u, int to) {
    return in_.policy.kernel_moves_numa && dev(u, u.resident).numa && dev(u, to).numa;
  }

  // Leaves a unit alone after a refused move: 1 s (or min_residence), doubling, at most a
  // minute; a refusal is the program's doing (protections, attributes) and lasts a while.
  void back_off(Unit& u) const {
    const uint64_t base = std::max<uint64_t>(in_.policy.min_residence_ns, 1'000'000'000);
    u.refused_until = in_.now + std::min<uint64_t>(base << std::min(u.refusals, 6u), 60'000'000'000);
    ++u.refusals;
  }

  // Moves unit i to device `to` of its pool: OK, or why not (BUSY: the budget is spent;
  // NOT_SUPPORTED: the kernel's move, or refused; the mover's status).
  cxlpool_status_t move(size_t i, int to) {
    Unit& u = in_.units[i];
    if (u.committed > in_.tokens) {
      ++sum_.budget_deferred;
      return CXLPOOL_E_BUSY;
    }
    if (kernel_owns(u, to)) return CXLPOOL_E_NOT_SUPPORTED;
    const Outcome o = exec_.execute(Move{i, to});
    if (!o.attempted) {
      back_off(u);
      return o.status;
    }
    u.moved_at = in_.now;  // failed or not: not retried before min_residence (but see promote())
    if (o.status != CXLPOOL_OK) {
      if (o.status == CXLPOOL_E_NOT_SUPPORTED) back_off(u);  // refused before any page was copied
      return o.status;
    }
    u.refusals = 0;
    sum_.spent += o.bytes;
    in_.tokens -= std::min(in_.tokens, o.bytes);
    Room& from = dev(u, u.resident).room;
    from.committed -= std::min(from.committed, o.bytes);
    dev(u, to).room.committed += o.bytes;
    u.resident = to;
    return CXLPOOL_OK;
  }

  // Pinned units that are not on their tier (a pin made while their device was full).
  void move_pinned() {
    for (size_t i = 0; i < in_.units.size(); ++i) {
      const Unit& u = in_.units[i];
      if (u.pin < 0 || tier(u, u.resident) == u.pin || settled(u)) continue;
      const int to = first_of_tier(pool(u), u.pin);
      if (to >= 0) (void)move(i, to);
    }
  }

  // Per fast device: the units that may use it, hottest first, and its residents, coldest
  // first.
  void by_fast_device() {
    struct Lists {
      bool used = false;
      std::vector<size_t> up, down;
    };
    std::vector<Lists> by_fast(in_.devices.size());
    for (size_t i = 0; i < in_.units.size(); ++i) {
      const Unit& u = in_.units[i];
      if (u.pin >= 0 || settled(u)) continue;
      const Fast f = fastest(pool(u));
      if (f.di < 0) continue;
      Lists& l = by_fast[size_t(device(u, f.di))];
      l.used = true;
      if (tier(u, u.resident) == f.tier)
        l.down.push_back(i);
      else if (u.heat >= in_.policy.hot && u.committed)
        l.up.push_back(i);
    }
    for (size_t fd = 0; fd < by_fast.size(); ++fd) {
      if (!by_fast[fd].used) continue;
      std::vector<size_t>& up = by_fast[fd].up;
      std::vector<size_t>& down = by_fast[fd].down;
      const std::vector<Unit>& units = in_.units;
      std::stable_sort(up.begin(), up.end(), [&](size_t a, size_t b) { return units[a].heat > units[b].heat; });
      std::stable_sort(down.begin(), down.end(), [&](size_t a, size_t b) { return units[a].heat < units[b].heat; });
      demote_and_promote(fd, up, down);
    }
  }

  void demote_and_promote(size_t fd, const std::vector<size_t>& up, const std::vector<size_t>& down) {
    const Policy& pol = in_.policy;
    const Room& room = in_.devices[fd].room;  // follows the moves
    size_t victim = 0;
    // Demotes the coldest resident below `below` (and, making room for candidate c, one whose
    // heat is clearly below c's: by more than 4 times their estimates' combined noise, since
    // the hottest candidate and the coldest resident are the extremes of many).
    auto demote_one = [&](double below, const Unit* c) {
      while (victim < down.size()) {
        const size_t vi = down[victim++];
        const Unit& v = in_.units[vi];
        if (v.heat >= below || !v.committed) continue;
        if (c && c->heat - v.heat <= 4 * std::sqrt(c->noise * c->noise + v.noise * v.noise)) continue;
        const int to = demotion_target(v, tier(v, v.resident));
        if (to >= 0 && move(vi, to) == CXLPOOL_OK) return true;
        if (in_.tokens == 0) return false;
      }
      return false;
    };
    // Above the high watermark: cold residents go down until below the low one.
    if (pol.demote)
      while (room.above_high() && in_.tokens > 0) {
        const uint64_t before = room.committed;
        if (!demote_one(pol.cold, nullptr) || room.committed >= before) break;
        if (room.at_or_below_low()) break;
      }
    if (!pol.promote) return;
    for (const size_t ci : up) {
      Unit& c = in_.units[ci];
      if (in_.tokens == 0) {
        ++sum_.budget_deferred;
        break;
      }
      // Room for it, making room by demoting a resident this many times colder if needed. A
      // resident is displaced only if it is `hysteresis` times colder and colder by at least
      // the hot threshold itself: sampled heat is noisy, and units of one uniform workload
      // must not swap places on noise.
      const double displace_below = std::min(c.heat / pol.hysteresis, c.heat - pol.hot);
      while (!room.fits_below_high(c.committed))
        if (!pol.demote || !demote_one(displace_below, &c)) break;
      if (!room.fits_below_high(c.committed)) continue;
      const Fast f = fastest(pool(c));
      if (f.di < 0 || size_t(device(c, f.di)) != fd) continue;
      // A device can be full before its watermark says so (its offsets are fragmented): make
      // room the same way, once.
      if (move(ci, f.di) == CXLPOOL_E_CAPACITY && pol.demote && demote_one(displace_below, &c)) {
        c.moved_at = 0;
        (void)move(ci, f.di);
      }
    }
  }

  Input& in_;
  Executor& exec_;
  Summary sum_;
};

// Every move succeeds and moves the unit's committed bytes.
class Recorder final : public Executor {
 public:
  explicit Recorder(const Input& in) : in_(in) {}
  Outcome execute(const Move& m) override {
    moves.push_back(m);
    return Outcome{CXLPOOL_OK, true, in_.units[m.unit].committed};
  }
  std::vector<Move> moves;

 private:
  const Input& in_;
};

}  // namespace

Summary run(Input& in, Executor& exec) { return Step(in, exec).run(); }

std::vector<Move> plan(Input in) {
  Recorder r(in);
  (void)run(in, r);
  return std::move(r.moves);
}

}  // namespace cxlpool::detail::tiering::planner
