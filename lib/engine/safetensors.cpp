// SPDX-License-Identifier: MIT
// The safetensors reader (safetensors.hpp): the header is read and validated at open; a tensor
// is read with pread and converted to fp32 when asked for (not mapped: a file truncated under
// the reader is then an error, not a SIGBUS).
#include "engine/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "engine/error.hpp"
#include "engine/half.hpp"
#include "engine/json_value.hpp"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors data is little-endian; this reader copies it as is");

namespace cxlpool::engine {
namespace {

// The reference implementation allows 100 MB; a parsed header costs many times its bytes,
// and a real checkpoint's is well under 1 MiB (opt-66b's: about 100 KB).
constexpr uint64_t kMaxHeader = uint64_t(16) << 20;

// len bytes at off, or an error naming the file (short: it shrank under the reader).
void read_at(int fd, const std::string& path, void* buf, size_t len, uint64_t off) {
  auto* p = static_cast<unsigned char*>(buf);
  while (len) {
    const ssize_t k = pread(fd, p, len, off_t(off));
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) fail(path + ": cannot read: " + std::strerror(errno));
    if (k == 0) fail(path + ": ended at byte " + std::to_string(off) + ": the file shrank while it was read");
    p += k;
    len -= size_t(k);
    off += uint64_t(k);
  }
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

bool parse_dtype(const std::string& s, Dtype* out) {
  if (s == "F16") {
    *out = Dtype::kF16;
  } else if (s == "BF16") {
    *out = Dtype::kBF16;
  } else if (s == "F32") {
    *out = Dtype::kF32;
  } else {
    return false;
  }
  return true;
}

bool known_unsupported_dtype(const std::string& s) {
  static const char* const kOthers[] = {"BOOL", "U8",  "I8",  "I16", "U16",     "I32",
                                        "U32",  "I64", "U64", "F64", "F8_E4M3", "F8_E5M2"};
  return std::any_of(std::begin(kOthers), std::end(kOthers), [&](const char* o) { return s == o; });
}

}  // namespace

const char* dtype_name(Dtype d) {
  switch (d) {
    case Dtype::kF16:
      return "F16";
    case Dtype::kBF16:
      return "BF16";
    case Dtype::kF32:
      return "F32";
  }
  return "?";
}

size_t dtype_size(Dtype d) { return d == Dtype::kF32 ? 4 : 2; }

uint64_t TensorInfo::elements() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;  // bounded when the file was validated
  return n;
}

std::string shape_text(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  Fd f;
  // O_NONBLOCK: a FIFO named as the file must not block the open (it is refused below).
  f.fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (f.fd < 0) fail(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (fstat(f.fd, &st) != 0) fail(path + ": cannot stat: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail(path + ": not a regular file");
  const auto size = uint64_t(st.st_size);
  if (size < 8) fail(path + ": " + std::to_string(size) + " bytes: shorter than the 8-byte header length");
  {
    unsigned char len[8];
    read_at(f.fd, path, len, sizeof len, 0);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
    if (n == 0) fail(path + ": header length is 0 (a safetensors file starts with its JSON header's length)");
    if (n > size - 8)
      fail(path + ": header length " + std::to_string(n) + " is beyond the file's end (" + std::to_string(size) +
           " bytes): truncated or not a safetensors file");
    if (n > kMaxHeader)
      fail(path + ": header length " + std::to_string(n) + " exceeds the " + std::to_string(kMaxHeader >> 20) +
           " MiB this reader accepts");
    std::string header(size_t(n), '\0');
    read_at(f.fd, path, header.data(), header.size(), 8);
    data_start_ = 8 + n;
    const uint64_t data_bytes = size - data_start_;
    const JsonValue doc = parse_json(header, path);
    if (!doc.is_object()) fail(path + ": JSON header is " + JsonValue::kind_name(doc.kind()) + ", not an object");
    std::vector<std::pair<uint64_t, std::string>> by_begin;
    for (const auto& [name, v] : doc.members()) {
      if (name == "__metadata__") {
        if (!v.is_object()) fail(path + ": __metadata__ is not an object");
        for (const auto& [k, mv] : v.members()) {
          if (!mv.is_string()) fail(path + ": __metadata__ \"" + k + "\" is not a string");
          metadata_[k] = mv.string();
        }
        continue;
      }
      const std::string where = path + ": tensor \"" + shown(name) + "\"";
      if (name.empty()) fail(path + ": a tensor has an empty name");
      if (!v.is_object()) fail(where + ": is " + JsonValue::kind_name(v.kind()) + ", not an object");
      for (const auto& [k, unused] : v.members())
        if (k != "dtype" && k != "shape" && k != "data_offsets") fail(where + ": unknown field \"" + k + "\"");
      const JsonValue* dt = v.find("dtype");
      const JsonValue* sh = v.find("shape");
      const JsonValue* off = v.find("data_offsets");
      if (!dt || !sh || !off) fail(where + ": needs dtype, shape and data_offsets");
      TensorInfo t;
      if (!dt->is_string()) fail(where + ": dtype is not a string");
      if (!parse_dtype(dt->string(), &t.dtype)) {
        if (known_unsupported_dtype(dt->string()))
          fail(where + ": dtype " + dt->string() + " is not supported (F16, BF16 or F32)");
        fail(where + ": unknown dtype \"" + dt->string() + "\"");
      }
      if (!sh->is_array()) fail(where + ": shape is not an array");
      if (sh->array().size() > 8) fail(where + ": shape has " + std::to_string(sh->array().size()) + " dimensions");
      // The element count may not overflow: bounded by the data region (checked below too).
      unsigned __int128 count = 1;
      for (const JsonValue& d : sh->array()) {
        uint64_t x = 0;
        if (!d.as_u64(&x)) fail(where + ": shape holds something other than a non-negative integer");
        t.shape.push_back(x);
        count *= x;
        if (count > data_bytes) count = data_bytes + uint64_t(1);  // saturate: already too large
      }
      if (!off->is_array() || off->array().size() != 2 || !off->array()[0].as_u64(&t.begin) ||
          !off->array()[1].as_u64(&t.end))
        fail(where + ": data_offsets is not [begin, end] of non-negative integers");
      if (t.begin > t.end)
        fail(where + ": data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
             "] ends before it begins");
      if (t.end > data_bytes)
        fail(where + ": data_offsets end " + std::to_string(t.end) + " is beyond the data (" +
             std::to_string(data_bytes) + " bytes after the header)");
      const unsigned __int128 want = count * dtype_size(t.dtype);
      if (want != t.end - t.begin)
        fail(where + ": shape " + shape_text(t.shape) + " of " + dt->string() + " needs " +
             (count > data_bytes ? std::string("more bytes than the file has")
                                 : std::to_string(uint64_t(want)) + " bytes") +
             " but data_offsets span " + std::to_string(t.end - t.begin));
      by_begin.emplace_back(t.begin, name);
      tensors_.emplace(name, std::move(t));
    }
    // The data region is covered exactly once, in offset order (the format's rule).
    std::sort(by_begin.begin(), by_begin.end(), [&](const auto& a, const auto& b) {
      if (a.first != b.first) return a.first < b.first;
      return tensors_.at(a.second).end < tensors_.at(b.second).end;
    });
    uint64_t covered = 0;
    std::string previous;
    for (const auto& [begin, name] : by_begin) {
      const TensorInfo& t = tensors_.at(name);
      if (begin < covered)
        fail(path + ": tensor \"" + shown(name) + "\" [" + std::to_string(begin) + ", " + std::to_string(t.end) +
             ") overlaps tensor \"" + previous + "\" (which ends at " + std::to_string(covered) + ")");
      if (begin > covered)
        fail(path + ": bytes [" + std::to_string(covered) + ", " + std::to_string(begin) +
             ") of the data belong to no tensor (before \"" + name + "\")");
      covered = t.end;
      previous = name;
    }
    if (covered != data_bytes)
      fail(path + ": the data is " + std::to_string(data_bytes) + " bytes but the tensors end at " +
           std::to_string(covered) + " (bytes that belong to no tensor, or a damaged header)");
  }
  fd_ = f.fd;
  f.fd = -1;
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) close(fd_);
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::vector<float> SafetensorsFile::read_f32(const std::string& name, const std::vector<uint64_t>& shape) const {
  const TensorInfo* t = find(name);
  if (!t) fail(path_ + ": tensor \"" + name + "\" is missing");
  if (t->shape != shape)
    fail(path_ + ": tensor \"" + name + "\" has shape " + shape_text(t->shape) + ", expected " + shape_text(shape));
  const size_t n = size_t(t->elements());
  std::vector<float> out(n);
  if (n == 0) return out;  // (an empty vector's data() may be null: no memcpy into it)
  if (t->dtype == Dtype::kF32) {
    read_at(fd_, path_, out.data(), n * 4, data_start_ + t->begin);
    return out;
  }
  // 16-bit elements, 4 MiB at a time.
  std::vector<unsigned char> buf(std::min<size_t>(n * 2, size_t(4) << 20));
  for (size_t done = 0; done < n;) {
    const size_t count = std::min(n - done, buf.size() / 2);
    read_at(fd_, path_, buf.data(), count * 2, data_start_ + t->begin + uint64_t(done) * 2);
    const unsigned char* p = buf.data();
    if (t->dtype == Dtype::kF16)
      for (size_t i = 0; i < count; ++i) out[done + i] = fp16_to_float(uint16_t(p[2 * i] | (p[2 * i + 1] << 8)));
    else
      for (size_t i = 0; i < count; ++i) out[done + i] = bf16_to_float(uint16_t(p[2 * i] | (p[2 * i + 1] << 8)));
    done += count;
  }
  return out;
}

}  // namespace cxlpool::engine
