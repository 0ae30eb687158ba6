// SPDX-License-Identifier: MIT
// Backing providers: the one table through which everything that depends on a device's kind
// is done — its text in the device grammar, the name it stands for, its claim, its
// capabilities and fork behaviour, opening its storage for private pools, and opening,
// creating and removing the named object that holds a shared pool. One file per backend
// (backing/providers/); a backend is added by one new file and one line in provider.cpp's
// table (or, in a test, register_provider). Nothing outside this table tests a kind to
// decide how to open or name a device.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backing/backing_spec.hpp"
#include "cxlpool/backing.h"
#include "os/os.hpp"

namespace cxlpool::detail {

// What a provider opened for a private device's Storage (backing/storage.cpp).
struct StorageOpen {
  int fd = -1;                    // a descriptor cxlpool created; -1: anonymous memory
  int numa_node = -1;             // anonymous memory is bound to this node (-1: none)
  std::string description;        // for messages: "memfd", "unnamed file in /dev/shm", ...
  bool sized_by_cxlpool = false;  // a file cxlpool made: truncated to the capacity, resizable
  bool room_limited = false;      // its filesystem can fill up (fallocate at commit)
  bool filesystem_file = false;   // a file of a filesystem: DAX or hugetlbfs decide its mapping
  // A storage whose capacity is parts of a larger offset space (extents borrowed from a shared
  // pool): space is its size, online the ranges that are capacity at open (possibly none).
  // space 0: the offset space is [0, capacity), all of it online.
  uint64_t space = 0;
  std::vector<std::pair<uint64_t, uint64_t>> online;
  std::string refusal;  // why online is less than the capacity asked for ("": it is not)
  // Kept by the storage for as long as it lives (a provider learns from it that nothing maps
  // the storage any more).
  std::shared_ptr<void> state;
};

// The named object holding a shared pool, open: a regular file (shm:NAME, file:PATH) or a
// device node (devdax:PATH) held under flock(LOCK_SH) while open for use. Owns its descriptor
// (closed with it, unless taken with release()).
struct SharedObject {
  int fd = -1;
  bool device_node = false;  // no size of its own to read; mapped in 2 MiB units
  uint64_t size = 0;         // bytes; UINT64_MAX for a device node
  std::string path;

  SharedObject() = default;
  SharedObject(SharedObject&& o) noexcept
      : fd(std::exchange(o.fd, -1)), device_node(o.device_node), size(o.size), path(std::move(o.path)) {}
  SharedObject& operator=(SharedObject&&) = delete;
  ~SharedObject() { os::close_fd(fd); }
  int release() noexcept { return std::exchange(fd, -1); }
};

// How a kind's named object is opened, created and removed (shared pools). Every call throws
// Failure naming what (the pool as the user wrote it).
struct SharedObjectOps {
  // Opens the existing object, checked to be what the kind names. writable: for use (a device
  // node is then held under flock(LOCK_SH), CXLPOOL_E_BUSY while a private device holds it);
  // otherwise a read-only look that locks and writes nothing.
  SharedObject (*open)(const BackingSpec& spec, bool writable, const std::string& what);
  // A new object, not yet visible to anyone who opens it by name (an unnamed file), or the
  // device node under flock(LOCK_EX) for formatting. site keeps what publish needs.
  SharedObject (*create)(const BackingSpec& spec, unsigned mode, const std::string& what, os::NewFileSite* site);
  // Makes a created object what opening its name finds (link; a device node: LOCK_EX -> LOCK_SH).
  void (*publish)(SharedObject* obj, os::NewFileSite* site, const std::string& what);
  // Removes the object's name while it still is the object identified (CXLPOOL_E_NOT_SUPPORTED
  // for a device node).
  void (*remove)(const BackingSpec& spec, const os::PathIdentity& expected, const std::string& what);
};

struct Provider {
  const char* word;    // the grammar's word: "numa", "memfd", "shm", "file", "devdax"
  int kind;            // cxlpool_backing_kind_t; a test's provider uses a value of its own (>= 64)
  const char* syntax;  // for messages: "numa:N"
  bool anonymous;      // no descriptor: anonymous memory placed by a memory policy
  bool device_node;    // a device node: one offset space for every mapping, its size fixed,
                       // never mapped privately (a fork child's copy goes to a memfd)
  // Parses what follows the word (has_arg: a ':' followed it) into out's kind, numa_node and
  // path. Returns "" or why the text is wrong.
  std::string (*parse)(std::string_view arg, bool has_arg, BackingSpec* out);
  // The canonical text; parsing it gives the same spec.
  std::string (*format)(const BackingSpec& spec);
  // The filesystem name the device stands for, "" when none: a private device never creates,
  // opens or writes it (it lives in an unnamed file); a shared pool lives there.
  std::string (*named_path)(const BackingSpec& spec);
  // The identity a claim is taken on (the same object however it is named), "" for a device no
  // other process can name.
  std::string (*claim_identity)(const BackingSpec& spec);
  // Opens the storage of a private device (fork_copy: a fork child's own copy). Throws Failure.
  void (*open_storage)(const BackingSpec& spec, bool fork_copy, StorageOpen* out);
  // nullptr when the kind cannot hold a shared pool.
  const SharedObjectOps* shared;
  // Checks a declared private device before anything is opened (discovery, at declaration):
  // "" or why its location cannot serve (sized: the declaration gave size=). nullptr: nothing
  // to check.
  std::string (*check_declared)(const BackingSpec& spec, bool sized);
  // Capacity on request (nullptr: none): called by the device, holding none of its locks, when
  // no free range of bytes is left. Each range of the offset space it makes available (extents
  // it borrowed) goes to add(ctx, lo, hi), the device's, before the provider lets anyone else
  // see it: the provider may give back a range only when none of it is online, so a range it
  // has not yet handed to the device must not look like one the device withdrew. A range add
  // refuses goes back at once. True when add took one; false with why (why_len bytes, NUL
  // terminated) saying what refused it. noexcept.
  using AddRange = bool (*)(void* ctx, uint64_t lo, uint64_t hi);
  bool (*grow)(const BackingSpec& spec, uint64_t bytes, AddRange add, void* ctx, char* why, size_t why_len);
};

// Shared by providers: WORD:PATH with PATH absolute and not ending in '/' ("" or why not,
// naming example).
std::string parse_absolute_path(std::string_view arg, bool has_arg, std::string_view word, const char* example,
                                BackingSpec* out);
// Shared by the file kinds: a private device's storage is an unnamed file in dir (never the
// device's name), its room taken from that filesystem.
void open_unnamed_file_storage(const std::string& dir, const BackingSpec& spec, StorageOpen* out);
// Shared by the kinds that are only ever mapped shared (devdax, pool): a fork child's copy of
// a private range lives in a memfd of its own.
void open_fork_copy_storage(const BackingSpec& spec, StorageOpen* out);
// Shared by the file kinds' check_declared: a size given, the named path's directory a real
// directory on a filesystem that can hold memory, and the name itself absent (a private device
// never touches an existing object).
std::string check_named_file_declared(const BackingSpec& spec, bool sized);

// The provider of a kind, or nullptr.
const Provider* provider_for(int kind) noexcept;
// The provider whose grammar word is word, or nullptr.
const Provider* provider_named(std::string_view word) noexcept;
// Adds a provider (tests: a fake backend). false when its word or kind is taken. Not
// thread-safe against concurrent lookups: call before any device is opened.
bool register_provider(const Provider* p) noexcept;
// "numa:N, shm, shm:NAME, ..." for messages.
std::string provider_syntaxes();

// The one grammar of where a device's bytes are (docs/config.md): WORD or WORD:ARG of a
// registered provider. Fills out's kind, numa_node and path; returns "" or why the text is
// wrong (the caller names where it was written).
std::string parse_location(std::string_view text, BackingSpec* out);
// Canonical text of a spec's location ("?" for an unknown kind).
std::string format_location(const BackingSpec& spec);

// The shared-pool magic at offset 0 of a pool's named object: the device layer recognises a
// shared device by it, and no private device adopts one that carries it.
inline constexpr char kSharedPoolMagic[16] = {'C', 'X', 'L', 'P', 'O', 'O', 'L', '-',
                                              'S', 'H', 'A', 'R', 'E', 'D', '0', '1'};

// Shared pools' named objects through their kind's provider: CXLPOOL_E_CONFIG naming the
// kinds that can hold one when spec's cannot.
// The named object of the file kinds (shm:NAME, file:PATH): a regular file, created unnamed
// and linked once whole (backing/shared_file.cpp).
extern const SharedObjectOps kSharedFileOps;

const SharedObjectOps& shared_object_ops(const BackingSpec& spec, const std::string& what);

}  // namespace cxlpool::detail
