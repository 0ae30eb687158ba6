// SPDX-License-Identifier: MIT
// The Python binding (module "cxlpool", pybind11 from Debian): shared pools and the KV block
// arena (geometry, sequences, export and import handles, views) over the public C ABI only.
// Block bytes go to Python through the buffer protocol without a copy: memoryview(block) is the
// pool's memory. Every object keeps alive what it points into (a view its pools, a block its
// view or sequence), and an object whose blocks are still exported refuses to be released or
// destroyed (cxlpool.Error, status CXLPOOL_E_BUSY) instead of leaving a memoryview dangling;
// a sequence likewise refuses to seal a block a writable memoryview of it could still change.
// Errors raise cxlpool.Error with cxlpool's own message and its status (.status, .name).
// Hardened after a hostile review: objects made with Cls.__new__ (no __init__) are refused
// (pybind11 2.10 hands methods uninitialised storage otherwise); new objects are given to
// Python as owned raw pointers after a probe allocation (pybind11 2.10 dereferences a failed
// allocation, and double-frees a unique_ptr whose wrapping failed); the pools of an arena or a
// view are collected before any is used (a sequence's iteration may close one); arguments are
// parsed strictly (ints that are not bool, names without NUL, handles from any buffer).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cxlpool/cxlpool.h"

namespace py = pybind11;

namespace {

PyObject* g_error = nullptr;  // cxlpool.Error

std::string status_name(cxlpool_status_t s) {
  std::string text = cxlpool_status_str(s);
  return text.substr(0, text.find(':'));
}

[[noreturn]] void raise(cxlpool_status_t status, const std::string& message) {
  py::object e = py::reinterpret_borrow<py::object>(g_error)(py::str(message));
  e.attr("status") = int(status);
  e.attr("name") = status_name(status);
  PyErr_SetObject(g_error, e.ptr());
  throw py::error_already_set();
}

void check(cxlpool_status_t status) {
  if (status != CXLPOOL_OK) raise(status, cxlpool_last_error_message());
}

// An int argument: a Python int (not bool) in [0, max]; cxlpool.Error naming `what` otherwise.
uint64_t to_u64(const py::handle& v, const char* what, uint64_t max = UINT64_MAX) {
  if (!PyLong_Check(v.ptr()) || PyBool_Check(v.ptr()))
    raise(CXLPOOL_E_INVALID_ARGUMENT,
          std::string(what) + " must be an int, not " + std::string(py::str(py::type::handle_of(v).attr("__name__"))));
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
  if (overflow > 0) {
    const unsigned long long u = PyLong_AsUnsignedLongLong(v.ptr());
    if (PyErr_Occurred()) {
      PyErr_Clear();
      raise(CXLPOOL_E_INVALID_ARGUMENT, std::string(what) + " is above 2^64 - 1");
    }
    if (u > max)
      raise(CXLPOOL_E_INVALID_ARGUMENT,
            std::string(what) + " " + std::to_string(u) + " is above " + std::to_string(max));
    return u;
  }
  if (overflow < 0 || x < 0) raise(CXLPOOL_E_INVALID_ARGUMENT, std::string(what) + " must not be negative");
  if (uint64_t(x) > max)
    raise(CXLPOOL_E_INVALID_ARGUMENT, std::string(what) + " " + std::to_string(x) + " is above " + std::to_string(max));
  return uint64_t(x);
}

// A name for the C library: no NUL inside (it would cut the name short).
const std::string& to_name(const std::string& s, const char* what) {
  if (s.find('\0') != std::string::npos)
    raise(CXLPOOL_E_INVALID_ARGUMENT,
          std::string(what) + " contains a NUL byte (at " + std::to_string(s.find('\0')) + ")");
  return s;
}

// Hands a new C++ object to Python, owned by it. pybind11 2.10 dereferences a failed instance
// allocation (MemoryError) and double-frees a unique_ptr whose wrapping failed: so a probe
// allocation of the wrapper comes first (the next one of the same size reuses its memory), and
// the object goes as a raw pointer (a failure after that frees it once).
template <class T>
py::object give(std::unique_ptr<T> object) {
  auto* type = reinterpret_cast<PyTypeObject*>(py::type::of<T>().ptr());
  PyObject* probe = type->tp_alloc(type, 0);
  if (!probe) throw py::error_already_set();
  type->tp_free(probe);
  return py::cast(object.release(), py::return_value_policy::take_ownership);
}

// The C++ object of a Python object of class T, only if its __init__ ran: pybind11 2.10 gives
// an object made by T.__new__(T) uninitialised storage, which no method may touch.
template <class T>
T& live(const py::handle& self, const char* what) {
  if (!py::isinstance<T>(self)) raise(CXLPOOL_E_INVALID_ARGUMENT, std::string(what) + ": not the right cxlpool object");
  auto* inst = reinterpret_cast<py::detail::instance*>(self.ptr());
  py::detail::value_and_holder vh = inst->get_value_and_holder(py::detail::get_type_info(typeid(T)), false);
  if (!vh.inst || !vh.holder_constructed())
    raise(CXLPOOL_E_INVALID_ARGUMENT, std::string(what) + ": the object was made by __new__ without __init__");
  return *vh.template value_ptr<T>();
}

// Cls.__new__(Cls) for a class Python must not make itself: refused (the objects come from
// create/open, arena.sequence(), seq.block(), view.block(), import_view()).
extern "C" PyObject* refuse_new(PyTypeObject* type, PyObject*, PyObject*) {
  PyErr_Format(PyExc_TypeError, "cxlpool.%s objects are made by the module, not by %s.__new__", type->tp_name,
               type->tp_name);
  return nullptr;
}
void refuse_direct_creation(const py::handle& cls) {
  auto* type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  type->tp_new = refuse_new;
  PyType_Modified(type);
}

// ---- shared pools ----

struct Pool {
  cxlpool_shared_pool_t* pool = nullptr;
  std::string device;
  int users = 0;  // arenas and views on it: close() waits for them

  ~Pool() {
    if (pool) cxlpool_shared_pool_close(pool);
  }
  cxlpool_shared_pool_t* get(const char* who) const {
    if (!pool) raise(CXLPOOL_E_INVALID_ARGUMENT, std::string(who) + ": the pool " + device + " is closed");
    return pool;
  }
  void close() {
    if (users)
      raise(CXLPOOL_E_BUSY, "SharedPool.close: " + std::to_string(users) + " arena(s) or view(s) on " + device +
                                " are still alive (destroy or release them first)");
    if (pool) check(cxlpool_shared_pool_close(pool));
    pool = nullptr;
  }
};

struct Params {
  cxlpool_shared_params_t* p = nullptr;
  Params() { check(cxlpool_shared_params_create(&p)); }
  ~Params() { cxlpool_shared_params_destroy(p); }
};

py::object create_pool(const std::string& device, const py::object& size, const py::object& leases) {
  to_name(device, "SharedPool.create: device");
  Params params;
  check(cxlpool_shared_params_set_size(params.p, to_u64(size, "SharedPool.create: size")));
  if (!leases.is_none())
    check(
        cxlpool_shared_params_set_leases(params.p, uint32_t(to_u64(leases, "SharedPool.create: leases", UINT32_MAX))));
  auto pool = std::make_unique<Pool>();
  pool->device = to_name(device, "SharedPool.create: device");
  check(cxlpool_shared_pool_create(device.c_str(), params.p, 0, &pool->pool));
  return give(std::move(pool));
}

py::object open_pool(const std::string& device) {
  auto pool = std::make_unique<Pool>();
  pool->device = to_name(device, "SharedPool.open: device");
  check(cxlpool_shared_pool_open(device.c_str(), nullptr, &pool->pool));
  return give(std::move(pool));
}

py::dict pool_info(const Pool& p) {
  cxlpool_shared_info_t i{};
  check(cxlpool_shared_pool_info(p.get("SharedPool.info"), &i));
  py::dict d;
  d["size"] = i.size;
  d["extent_size"] = i.extent_size;
  d["extents_total"] = i.extents_total;
  d["extents_free"] = i.extents_free;
  d["bytes_in_use"] = i.bytes_in_use;
  d["participants"] = i.participants;
  d["slot"] = i.slot;
  d["leases_held"] = i.leases_held;
  return d;
}

// The pools an arena or a view uses: Python references (they outlive it) and their handles.
struct PoolSet {
  std::vector<py::object> owners;
  std::vector<Pool*> objects;  // the owners' C++ objects (counted as users once all are taken)
  std::vector<cxlpool_shared_pool_t*> handles;

  // The sequence is read first (its iteration is Python code: it may close a pool), then every
  // pool is marked in use, then their handles are taken (no Python code runs between).
  PoolSet(const py::handle& pools, const char* who) {
    if (!py::isinstance<py::sequence>(pools) || py::isinstance<py::str>(pools))
      raise(CXLPOOL_E_INVALID_ARGUMENT, std::string(who) + ": pools must be a list of cxlpool.SharedPool objects");
    for (const py::handle& h : py::reinterpret_borrow<py::sequence>(pools)) {
      owners.push_back(py::reinterpret_borrow<py::object>(h));
      if (owners.size() > 16) raise(CXLPOOL_E_INVALID_ARGUMENT, std::string(who) + ": 1 to 16 pools");
    }
    if (owners.empty()) raise(CXLPOOL_E_INVALID_ARGUMENT, std::string(who) + ": 1 to 16 pools");
    for (const py::object& o : owners) {
      if (!py::isinstance<Pool>(o))
        raise(CXLPOOL_E_INVALID_ARGUMENT, std::string(who) + ": pools must be cxlpool.SharedPool objects");
      objects.push_back(&o.cast<Pool&>());
    }
    for (Pool* p : objects) handles.push_back(p->get(who));
    for (Pool* p : objects) ++p->users;
  }
  ~PoolSet() {  // (runs only for a complete PoolSet: every pool was counted)
    for (Pool* p : objects) --p->users;
  }
  PoolSet(const PoolSet&) = delete;
  PoolSet& operator=(const PoolSet&) = delete;
};

// ---- geometry ----

struct Geometry {
  cxlpool_kv_geometry_t g{};
  uint64_t per_token = 0, per_block = 0;

  static const char* dtype_name(uint32_t d) {
    switch (d) {
      case CXLPOOL_KV_FP16:
        return "fp16";
      case CXLPOOL_KV_BF16:
        return "bf16";
      case CXLPOOL_KV_FP8:
        return "fp8";
      case CXLPOOL_KV_FP32:
        return "fp32";
    }
    return "?";
  }
  static Geometry from(const cxlpool_kv_geometry_t& g) {
    Geometry r;
    r.g = g;
    check(cxlpool_kv_geometry_sizes(&r.g, &r.per_token, &r.per_block));
    return r;
  }
  static Geometry make(uint32_t layers, uint32_t kv_heads, uint32_t head_dim, const std::string& dtype,
                       uint32_t tokens_per_block) {
    cxlpool_kv_geometry_t g{};
    g.layers = layers;
    g.kv_heads = kv_heads;
    g.head_dim = head_dim;
    g.tokens_per_block = tokens_per_block;
    if (dtype == "fp16")
      g.dtype = CXLPOOL_KV_FP16;
    else if (dtype == "bf16")
      g.dtype = CXLPOOL_KV_BF16;
    else if (dtype == "fp8")
      g.dtype = CXLPOOL_KV_FP8;
    else if (dtype == "fp32")
      g.dtype = CXLPOOL_KV_FP32;
    else
      raise(CXLPOOL_E_INVALID_ARGUMENT, "Geometry: dtype \"" + dtype + "\" (expected fp16, bf16, fp8 or fp32)");
    return from(g);
  }
  static Geometry preset(const std::string& model, uint32_t tokens_per_block) {
    cxlpool_kv_geometry_t g{};
    check(cxlpool_kv_geometry_preset(to_name(model, "Geometry.preset: model").c_str(), tokens_per_block, &g));
    return from(g);
  }
  uint64_t block_offset(uint32_t layer, uint32_t kv, uint32_t token) const {
    uint64_t off = 0;
    check(cxlpool_kv_block_offset(&g, layer, kv, token, &off));
    return off;
  }
  std::string repr() const {
    return "cxlpool.Geometry(layers=" + std::to_string(g.layers) + ", kv_heads=" + std::to_string(g.kv_heads) +
           ", head_dim=" + std::to_string(g.head_dim) + ", dtype='" + dtype_name(g.dtype) +
           "', tokens_per_block=" + std::to_string(g.tokens_per_block) + ")";
  }
};

// ---- block memory through the buffer protocol ----

// An object whose blocks may be exported: counts them, and the writable ones per block index.
struct Exporter {
  int exported = 0;
  std::map<uint64_t, int> writable;  // block index -> live writable Block objects
  void refuse_if_exported(const char* who) const {
    if (exported)
      raise(CXLPOOL_E_BUSY, std::string(who) + ": " + std::to_string(exported) +
                                " block(s) of it are still alive in Python (Block objects or memoryviews of them); "
                                "drop them first");
  }
};

struct Block {
  py::object owner;  // the Sequence or View (kept alive)
  Exporter* counter;
  void* data;
  uint64_t bytes;
  bool writable;
  uint64_t index;
  uint32_t tier;
  Block(py::object o, Exporter* c, void* d, uint64_t n, bool w, uint64_t i, uint32_t t)
      : owner(std::move(o)), counter(c), data(d), bytes(n), writable(w), index(i), tier(t) {
    ++counter->exported;
    if (writable) ++counter->writable[index];
  }
  ~Block() {
    --counter->exported;
    if (writable && --counter->writable[index] == 0) counter->writable.erase(index);
  }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;
};

// ---- the arena and its sequences ----

struct Arena {
  std::unique_ptr<PoolSet> pools;  // until destroy()
  Geometry geometry;
  cxlpool_kv_arena_t* arena = nullptr;

  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  Arena(const Geometry& g, const py::object& ps, const py::object& max_blocks, bool prefix_caching)
      : pools(std::make_unique<PoolSet>(ps, "KvArena")), geometry(Geometry::from(g.g)) {  // sizes recomputed
    if (pools->handles.size() > 4) raise(CXLPOOL_E_INVALID_ARGUMENT, "KvArena: at most 4 pools (tiers)");
    cxlpool_kv_params_t* params = nullptr;
    check(cxlpool_kv_params_create(&params));
    cxlpool_status_t s = cxlpool_kv_params_set_prefix_caching(params, prefix_caching ? 1 : 0);
    if (s == CXLPOOL_OK && !max_blocks.is_none()) {
      std::vector<uint64_t> limits;
      try {
        if (!py::isinstance<py::sequence>(max_blocks) || py::isinstance<py::str>(max_blocks))
          raise(CXLPOOL_E_INVALID_ARGUMENT, "KvArena: max_blocks must be a list of ints (one per pool)");
        for (const py::handle& v : py::reinterpret_borrow<py::sequence>(max_blocks))
          limits.push_back(to_u64(v, "KvArena: max_blocks"));
      } catch (...) {
        cxlpool_kv_params_destroy(params);
        throw;
      }
      for (size_t t = 0; t < limits.size() && s == CXLPOOL_OK; ++t)
        s = cxlpool_kv_params_set_max_blocks(params, uint32_t(t), limits[t]);
    }
    if (s == CXLPOOL_OK)
      s = cxlpool_kv_arena_create(&geometry.g, pools->handles.data(), pools->handles.size(), params, &arena);
    cxlpool_kv_params_destroy(params);
    check(s);
  }
  ~Arena() {
    if (arena) cxlpool_kv_arena_destroy(arena);  // the sequences hold references: none is left
  }
  cxlpool_kv_arena_t* get(const char* who) const {
    if (!arena) raise(CXLPOOL_E_INVALID_ARGUMENT, std::string(who) + ": the arena is destroyed");
    return arena;
  }
  void destroy() {
    if (arena) check(cxlpool_kv_arena_destroy(arena));  // BUSY while sequences of it live
    arena = nullptr;
    pools.reset();
  }
  py::dict stats() const {
    cxlpool_kv_stats_t st{};
    check(cxlpool_kv_arena_stats(get("KvArena.stats"), &st));
    py::dict d;
    d["blocks"] = std::vector<uint64_t>(st.blocks, st.blocks + 4);
    d["cached_blocks"] = st.cached_blocks;
    d["idle_blocks"] = st.idle_blocks;
    d["sequences"] = st.sequences;
    d["prefix_hits"] = st.prefix_hits;
    d["prefix_misses"] = st.prefix_misses;
    d["demotions"] = st.demotions;
    d["evictions"] = st.evictions;
    d["promotions"] = st.promotions;
    d["exports"] = st.exports;
    return d;
  }
};

struct Sequence : Exporter {
  py::object arena_owner;
  Arena* arena;
  cxlpool_kv_seq_t* seq = nullptr;

  Sequence(const Sequence&) = delete;
  Sequence& operator=(const Sequence&) = delete;
  explicit Sequence(py::object owner)
      : arena_owner(std::move(owner)), arena(&live<Arena>(arena_owner, "KvArena.sequence")) {
    check(cxlpool_kv_seq_create(arena->get("KvArena.sequence"), &seq));
  }
  ~Sequence() {
    if (seq) cxlpool_kv_seq_destroy(seq);
  }
  cxlpool_kv_seq_t* get(const char* who) const {
    if (!seq) raise(CXLPOOL_E_INVALID_ARGUMENT, std::string(who) + ": the sequence is destroyed");
    return seq;
  }
  size_t append(const py::iterable& tokens) {
    std::vector<int32_t> ids;
    for (const py::handle& t : tokens) {
      if (!PyLong_Check(t.ptr()) || PyBool_Check(t.ptr()))
        raise(CXLPOOL_E_INVALID_ARGUMENT, "Sequence.append: token ids must be ints, not " +
                                              std::string(py::str(py::type::handle_of(t).attr("__name__"))));
      int overflow = 0;
      const long long v = PyLong_AsLongLongAndOverflow(t.ptr(), &overflow);
      if (overflow || v < INT32_MIN || v > INT32_MAX)
        raise(CXLPOOL_E_INVALID_ARGUMENT,
              "Sequence.append: token id " + std::string(py::str(t)) + " is not a 32-bit int");
      ids.push_back(int32_t(v));
    }
    size_t reused = 0;
    check(cxlpool_kv_seq_append(get("Sequence.append"), ids.data(), ids.size(), &reused));
    return reused;
  }
  // A block whose tokens this seal completes becomes shared read-only (the prefix cache, the
  // importers). A memoryview's read-only flag is fixed when it is made, and the pool's pages
  // cannot be protected per block (blocks share pages; a write would be a SIGSEGV): so the seal
  // is refused while a writable Block of such a block, or a memoryview of one, is alive.
  void seal(const py::object& tokens) {
    cxlpool_kv_seq_t* s = get("Sequence.seal");
    const uint64_t n = to_u64(tokens, "Sequence.seal: tokens");
    const uint64_t per_block = arena->geometry.g.tokens_per_block;
    int alive = 0;
    for (const auto& [index, count] : writable)
      if (index < n / per_block) alive += count;  // block index holds tokens up to (index + 1) * per_block
    if (alive)
      raise(CXLPOOL_E_BUSY, "Sequence.seal: " + std::to_string(alive) +
                                " writable block(s) of the tokens being sealed are still alive in Python (Block "
                                "objects or memoryviews of them); a sealed block is shared read-only: drop them first");
    check(cxlpool_kv_seq_seal(s, n));
  }
  py::bytes export_handle(const py::object& tokens) {
    cxlpool_kv_handle_t h{};
    check(cxlpool_kv_seq_export(get("Sequence.export"), to_u64(tokens, "Sequence.export: tokens"), &h));
    return py::bytes(reinterpret_cast<const char*>(&h), sizeof h);
  }
  py::dict info() const {
    cxlpool_kv_seq_info_t i{};
    check(cxlpool_kv_seq_info(get("Sequence.info"), &i));
    py::dict d;
    d["tokens"] = i.tokens;
    d["blocks"] = i.blocks;
    d["sealed_tokens"] = i.sealed_tokens;
    d["shared_blocks"] = i.shared_blocks;
    return d;
  }
  void destroy() {
    refuse_if_exported("Sequence.destroy");
    if (seq) check(cxlpool_kv_seq_destroy(seq));
    seq = nullptr;
  }
};

// ---- views (imports) ----

struct View : Exporter {
  std::unique_ptr<PoolSet> pools;  // until release()
  cxlpool_kv_view_t* view = nullptr;
  cxlpool_kv_view_info_t info_{};

  View(const View&) = delete;
  View& operator=(const View&) = delete;
  View(const py::object& ps, const py::object& handle, const py::object& expected)
      : pools(std::make_unique<PoolSet>(ps, "import_view")) {
    cxlpool_kv_handle_t h{};
    if (!PyObject_CheckBuffer(handle.ptr()))
      raise(CXLPOOL_E_INVALID_ARGUMENT, "import_view: the handle must be bytes (or another buffer), not " +
                                            std::string(py::str(py::type::handle_of(handle).attr("__name__"))));
    {
      Py_buffer buffer{};
      if (PyObject_GetBuffer(handle.ptr(), &buffer, PyBUF_SIMPLE) != 0) throw py::error_already_set();
      const size_t n = size_t(buffer.len);
      if (n == sizeof h) std::memcpy(&h, buffer.buf, sizeof h);
      PyBuffer_Release(&buffer);
      if (n != sizeof h)
        raise(CXLPOOL_E_INVALID_ARGUMENT,
              "import_view: a handle has " + std::to_string(sizeof h) + " bytes, not " + std::to_string(n));
    }
    const cxlpool_kv_geometry_t* want = nullptr;
    if (!expected.is_none()) {
      if (!py::isinstance<Geometry>(expected))
        raise(CXLPOOL_E_INVALID_ARGUMENT, "import_view: expected must be a cxlpool.Geometry or None");
      want = &live<Geometry>(expected, "import_view: expected").g;
    }
    check(cxlpool_kv_import(pools->handles.data(), pools->handles.size(), want, &h, &view));
    cxlpool_kv_view_info(view, &info_);
  }
  ~View() {
    if (view) cxlpool_kv_view_release(view);
  }
  cxlpool_kv_view_t* get(const char* who) const {
    if (!view) raise(CXLPOOL_E_INVALID_ARGUMENT, std::string(who) + ": the view is released");
    return view;
  }
  void release() {
    refuse_if_exported("View.release");
    if (view) check(cxlpool_kv_view_release(view));
    view = nullptr;
    pools.reset();
  }
  py::dict info() const {
    get("View.info");
    py::dict d;
    d["geometry"] = Geometry::from(info_.geometry);
    d["tokens"] = info_.tokens;
    d["blocks"] = info_.blocks;
    d["bytes_per_block"] = info_.bytes_per_block;
    return d;
  }
};

// A with-block's end: the object is finished strictly, unless an exception is already on its
// way out (then a refusal, e.g. blocks still alive, must not hide it: the object is left to
// its destructor).
template <class F>
void finish(const py::object& exception_type, F&& f) {
  if (exception_type.is_none()) return f();
  try {
    f();
  } catch (py::error_already_set&) {
  }
}

}  // namespace

PYBIND11_MODULE(cxlpool, m) {
  m.doc() =
      "cxlpool: shared (CXL) memory pools and the KV block arena for inference servers. Block bytes are "
      "exported without copies (memoryview(block)); see docs/python.md.";
  g_error = PyErr_NewExceptionWithDoc("cxlpool.Error",
                                      "A cxlpool call failed: .status (the C status code), .name (its name), "
                                      "str(e) (cxlpool's message).",
                                      PyExc_RuntimeError, nullptr);
  m.attr("Error") = py::reinterpret_borrow<py::object>(g_error);
  m.attr("__version__") = cxlpool_version_string();

  // Every method takes its object by reference: one made by __new__ without __init__ (KvArena,
  // Geometry) has no C++ value, and pybind11 refuses it instead of passing a null pointer.
  auto pool_class =
      py::class_<Pool>(m, "SharedPool",
                       "A shared memory pool on a device (\"shm:NAME\", a DAX device or file), this process one of "
                       "its participants. Made by SharedPool.create or SharedPool.open.")
          .def_static("create", &create_pool, py::arg("device"), py::arg("size"), py::arg("leases") = py::none(),
                      "Creates the pool (the name must not exist: cxlpool never adopts what it did not make).")
          .def_static("open", &open_pool, py::arg("device"), "Joins an existing pool as a participant.")
          .def_static(
              "unlink",
              [](const std::string& device) {
                check(cxlpool_shared_pool_unlink(to_name(device, "SharedPool.unlink: device").c_str()));
              },
              py::arg("device"),
              "Removes a pool's name (only a cxlpool pool's). The pool ends for every participant: its name is "
              "how they find it.")
          .def_property_readonly("device", [](const Pool& p) { return p.device; })
          .def("info", [](const Pool& p) { return pool_info(p); })
          .def(
              "close", [](Pool& p) { p.close(); }, "Leaves the pool; refused (BUSY) while arenas or views on it live.")
          .def("__enter__", [](const py::object& self) { return self.cast<Pool&>(), self; })
          .def("__exit__", [](Pool& p, const py::object& type, const py::object&, const py::object&) {
            finish(type, [&] { p.close(); });
          });

  py::class_<Geometry>(m, "Geometry", "The shape of a model's KV cache.")
      .def(py::init([](const py::object& layers, const py::object& kv_heads, const py::object& head_dim,
                       const std::string& dtype, const py::object& tokens_per_block) {
             return Geometry::make(uint32_t(to_u64(layers, "Geometry: layers", UINT32_MAX)),
                                   uint32_t(to_u64(kv_heads, "Geometry: kv_heads", UINT32_MAX)),
                                   uint32_t(to_u64(head_dim, "Geometry: head_dim", UINT32_MAX)), dtype,
                                   uint32_t(to_u64(tokens_per_block, "Geometry: tokens_per_block", UINT32_MAX)));
           }),
           py::arg("layers"), py::arg("kv_heads"), py::arg("head_dim"), py::arg("dtype") = "fp16",
           py::arg("tokens_per_block") = 16)
      .def_static(
          "preset",
          [](const std::string& model, const py::object& tokens_per_block) {
            return Geometry::preset(
                model, uint32_t(to_u64(tokens_per_block, "Geometry.preset: tokens_per_block", UINT32_MAX)));
          },
          py::arg("model"), py::arg("tokens_per_block") = 16,
          "A known model's geometry: opt-6.7b, opt-13b, llama-3-8b, llama-3-70b, mistral-7b.")
      .def_property_readonly("layers", [](const py::object& g) { return live<Geometry>(g, "Geometry").g.layers; })
      .def_property_readonly("kv_heads", [](const py::object& g) { return live<Geometry>(g, "Geometry").g.kv_heads; })
      .def_property_readonly("head_dim", [](const py::object& g) { return live<Geometry>(g, "Geometry").g.head_dim; })
      .def_property_readonly(
          "dtype",
          [](const py::object& g) { return std::string(Geometry::dtype_name(live<Geometry>(g, "Geometry").g.dtype)); })
      .def_property_readonly("tokens_per_block",
                             [](const py::object& g) { return live<Geometry>(g, "Geometry").g.tokens_per_block; })
      .def_property_readonly("bytes_per_token",
                             [](const py::object& g) { return live<Geometry>(g, "Geometry").per_token; })
      .def_property_readonly("bytes_per_block",
                             [](const py::object& g) { return live<Geometry>(g, "Geometry").per_block; })
      .def(
          "block_offset",
          [](const py::object& self, const py::object& layer, const py::object& kv, const py::object& token) {
            return live<Geometry>(self, "Geometry.block_offset")
                .block_offset(uint32_t(to_u64(layer, "Geometry.block_offset: layer", UINT32_MAX)),
                              uint32_t(to_u64(kv, "Geometry.block_offset: kv", UINT32_MAX)),
                              uint32_t(to_u64(token, "Geometry.block_offset: token", UINT32_MAX)));
          },
          py::arg("layer"), py::arg("kv"), py::arg("token"),
          "Byte offset in a block of one token's head vectors of one layer (kv: 0 keys, 1 values).")
      .def("__eq__",
           [](const py::object& a, const py::object& b) {
             return py::isinstance<Geometry>(b) &&
                    std::memcmp(&live<Geometry>(a, "Geometry").g, &live<Geometry>(b, "Geometry").g,
                                sizeof(cxlpool_kv_geometry_t)) == 0;
           })
      .def("__repr__", [](const py::object& g) { return live<Geometry>(g, "Geometry").repr(); });

  auto block_class =
      py::class_<Block>(m, "Block", py::buffer_protocol(),
                        "One block's bytes in place: memoryview(block). Writable for a sequence's blocks that hold "
                        "tokens not yet sealed; read-only for sealed or shared blocks and for an imported view's.")
          .def_buffer([](Block& b) {
            return py::buffer_info(b.data, 1, py::format_descriptor<uint8_t>::format(), 1, {py::ssize_t(b.bytes)}, {1},
                                   !b.writable);
          })
          .def_property_readonly("index", [](const Block& b) { return b.index; })
          .def_property_readonly("tier", [](const Block& b) { return b.tier; })
          .def_property_readonly("writable", [](const Block& b) { return b.writable; })
          .def("__len__", [](const Block& b) { return b.bytes; });

  py::class_<Arena>(m, "KvArena", "Fixed-size KV blocks in shared pools (nearest first), with prefix sharing.")
      .def(py::init([](const py::object& geometry, const py::object& pools, const py::object& max_blocks,
                       bool prefix_caching) {
             return std::make_unique<Arena>(live<Geometry>(geometry, "KvArena: geometry"), pools, max_blocks,
                                            prefix_caching);
           }),
           py::arg("geometry"), py::arg("pools"), py::arg("max_blocks") = py::none(), py::arg("prefix_caching") = true)
      .def_property_readonly("geometry",
                             [](const py::object& a) { return live<Arena>(a, "KvArena.geometry").geometry; })
      .def(
          "sequence", [](const py::object& self) { return give(std::make_unique<Sequence>(self)); },
          "A new, empty sequence.")
      .def("stats", [](const py::object& a) { return live<Arena>(a, "KvArena.stats").stats(); })
      .def(
          "destroy", [](const py::object& a) { live<Arena>(a, "KvArena.destroy").destroy(); },
          "Frees its blocks; refused (BUSY) while sequences of it live.")
      .def("__enter__", [](const py::object& self) { return live<Arena>(self, "KvArena"), self; })
      .def("__exit__", [](const py::object& self, const py::object& type, const py::object&, const py::object&) {
        Arena& a = live<Arena>(self, "KvArena");
        finish(type, [&] { a.destroy(); });
      });

  auto sequence_class =
      py::class_<Sequence>(m, "Sequence", "A block table that grows by tokens. Made by KvArena.sequence().")
          .def(
              "append", [](Sequence& s, const py::iterable& tokens) { return s.append(tokens); }, py::arg("tokens"),
              "Extends by these token ids; returns how many leading tokens were found in the prefix cache.")
          .def(
              "block",
              [](const py::object& self, const py::object& index) {
                auto& s = self.cast<Sequence&>();
                const uint64_t i = to_u64(index, "Sequence.block: index");
                void* data = nullptr;
                uint32_t tier = 0;
                check(cxlpool_kv_seq_block(s.get("Sequence.block"), i, &data, &tier));
                cxlpool_kv_seq_info_t info{};
                check(cxlpool_kv_seq_info(s.seq, &info));
                // A block found in the prefix cache (the leading shared ones), or whose tokens are
                // all sealed (other sequences may share it from then on), is read-only.
                const bool writable =
                    i >= info.shared_blocks && (i + 1) * s.arena->geometry.g.tokens_per_block > info.sealed_tokens;
                return give(std::make_unique<Block>(self, &s, data, s.arena->geometry.per_block, writable, i, tier));
              },
              py::arg("index"))
          .def(
              "seal", [](Sequence& s, const py::object& tokens) { s.seal(tokens); }, py::arg("tokens"),
              "The first `tokens` tokens are written: their whole blocks become shared and read-only. Refused "
              "(BUSY) while a writable Block or memoryview of such a block is alive.")
          .def(
              "export", [](Sequence& s, const py::object& tokens) { return s.export_handle(tokens); },
              py::arg("tokens") = 0,
              "Publishes the first `tokens` tokens (0: all); returns the handle (bytes) a consumer imports.")
          .def("info", [](const Sequence& s) { return s.info(); })
          .def("destroy", [](Sequence& s) { s.destroy(); })
          .def("__enter__", [](const py::object& self) { return self.cast<Sequence&>(), self; })
          .def("__exit__", [](Sequence& s, const py::object& type, const py::object&, const py::object&) {
            finish(type, [&] { s.destroy(); });
          });

  auto view_class = py::class_<View>(m, "View", "An imported sequence: its blocks in place, leased until release().")
                        .def(
                            "block",
                            [](const py::object& self, const py::object& index) {
                              auto& v = self.cast<View&>();
                              const uint64_t i = to_u64(index, "View.block: index");
                              const void* data = nullptr;
                              check(cxlpool_kv_view_block(v.get("View.block"), i, &data));
                              return give(std::make_unique<Block>(self, &v, const_cast<void*>(data),
                                                                  v.info_.bytes_per_block, false, i, 0));
                            },
                            py::arg("index"))
                        .def_property_readonly("tokens", [](const View& v) { return v.info_.tokens; })
                        .def_property_readonly("blocks", [](const View& v) { return v.info_.blocks; })
                        .def("info", [](const View& v) { return v.info(); })
                        .def(
                            "release", [](View& v) { v.release(); },
                            "Drops the leases; refused (BUSY) while blocks of it are alive in Python.")
                        .def("__enter__", [](const py::object& self) { return self.cast<View&>(), self; })
                        .def("__exit__", [](View& v, const py::object& type, const py::object&, const py::object&) {
                          finish(type, [&] { v.release(); });
                        });

  m.def(
      "import_view",
      [](const py::object& pools, const py::object& handle, const py::object& expected) {
        return give(std::make_unique<View>(pools, handle, expected));
      },
      py::arg("pools"), py::arg("handle"), py::arg("expected") = py::none(),
      "Imports an exported sequence from pools open here; expected (a Geometry) must match the exporter's.");

  for (const py::handle& cls : std::initializer_list<py::handle>{pool_class, block_class, sequence_class, view_class})
    refuse_direct_creation(cls);
}
