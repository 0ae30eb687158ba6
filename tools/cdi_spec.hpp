// SPDX-License-Identifier: MIT
// A shared pool's quotas handed to containers: the CDI spec (Container Device Interface,
// cdiVersion 0.5.0, what podman 4.3 and Kubernetes DRA drivers give the runtime) that names
// one device per quota, and its safe writing. Header-only, over the public C API; used by
// cxlpool-compose cdi (docs/compose.md, "Containers"; docs/kubernetes.md).
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "cli_common.hpp"

namespace cxlpool::tools::cdi {

inline constexpr const char* kDefaultKind = "cxlpool.io/pool";
inline constexpr const char* kVersion = "0.5.0";  // podman 4.3 accepts 0.3.0 to 0.5.0

// One CDI device: a quota of the pool, opened with the key the spec carries.
struct QuotaDevice {
  std::string name;   // the CDI device name: kind=name on the runtime's command line
  std::string quota;  // the pool's quota
  std::string key;    // its key (cxlpool_compose_lock_quota)
};

// Where the pool's device lives on the host, from its location (shm:NAME, file:PATH,
// devdax:PATH): the path the spec mounts or passes as a device node. Empty, with *why, for a
// location no container can be handed.
struct HostObject {
  std::string path;
  bool device_node = false;  // devdax: a character device, passed as a node, not mounted
};
inline HostObject host_object(const std::string& location, std::string* why) {
  auto after = [&](const char* prefix) { return location.substr(strlen(prefix)); };
  HostObject h;
  if (location.rfind("shm:", 0) == 0) {
    h.path = "/dev/shm/" + after("shm:");
  } else if (location.rfind("file:", 0) == 0) {
    h.path = after("file:");
  } else if (location.rfind("devdax:", 0) == 0) {
    h.path = after("devdax:");
    h.device_node = true;
  } else {
    *why = "\"" + location + "\" is not a shared pool's location (shm:NAME, file:PATH, devdax:PATH)";
    return {};
  }
  // The location travels in CXLPOOL_DEVICES, whose grammar separates with ',' ';' and '=':
  // such a name cannot be declared there, so it is refused rather than split wrongly.
  if (location.find_first_of(",;=#") != std::string::npos) {
    *why =
        "the location \"" + location + "\" holds one of , ; = #, which CXLPOOL_DEVICES cannot carry: rename the pool";
    return {};
  }
  // The spec carries the path as JSON text to the runtime: printable ASCII without '\' and '"',
  // so that what the runtime mounts is byte for byte the host's path.
  for (char ch : location)
    if (static_cast<unsigned char>(ch) < 0x20 || static_cast<unsigned char>(ch) > 0x7e || ch == '\\' || ch == '"') {
      *why = "the location \"" + shown(location) +
             "\" holds a byte that is not printable ASCII, or a backslash or a quote: rename the pool";
      return {};
    }
  return h;
}

// Names as the CDI parser of podman 4.3 takes them, kept conservative: that parser indexes
// [1 : len-1] (one character panics it) and refuses a vendor or class ending in '.', '-' or
// '_', so every name here has two characters or more and begins and ends with a letter or
// digit. A device name: letters, digits, '_', '-', '.' between (no ':': podman splits on it).
inline bool alnum(char c) { return isalnum(static_cast<unsigned char>(c)) != 0; }
inline bool valid_name(const std::string& n, size_t max, const char* inner) {
  if (n.size() < 2 || n.size() > max || !alnum(n.front()) || !alnum(n.back())) return false;
  for (char c : n)
    if (!alnum(c) && !strchr(inner, c)) return false;
  return true;
}
inline bool valid_device_name(const std::string& n) { return valid_name(n, 63, "_-."); }
// A kind: VENDOR/CLASS. VENDOR a domain name of two labels or more (letters, digits, '-'
// inside a label), the class beginning with a letter (letters, digits, '_', '-').
inline bool valid_kind(const std::string& k) {
  const size_t slash = k.find('/');
  if (slash == std::string::npos || k.size() > 128) return false;
  const std::string vendor = k.substr(0, slash), cls = k.substr(slash + 1);
  if (!valid_name(cls, 63, "_-") || !isalpha(static_cast<unsigned char>(cls[0]))) return false;
  if (vendor.find('.') == std::string::npos || !isalpha(static_cast<unsigned char>(vendor[0]))) return false;
  for (size_t at = 0; at <= vendor.size();) {
    size_t dot = vendor.find('.', at);
    if (dot == std::string::npos) dot = vendor.size();
    const std::string label = vendor.substr(at, dot - at);
    if (label.empty() || !alnum(label.front()) || !alnum(label.back())) return false;
    for (char c : label)
      if (!alnum(c) && c != '-') return false;
    at = dot + 1;
  }
  return true;
}

// The spec: each device's container edits are the environment a program needs to join its
// quota (a cxlpool-run program through CXLPOOL_DEVICES, a linked one through CXLPOOL_POOL and
// CXLPOOL_QUOTA) with the key, and the pool's object at the same path as on the host (a
// container's /dev/shm is its own tmpfs, so the file is bind-mounted over it).
inline std::string spec_json(const std::string& kind, const std::string& location, const HostObject& obj,
                             const std::vector<QuotaDevice>& devices) {
  std::string j = "{\n  \"cdiVersion\": \"" + std::string(kVersion) + "\",\n  \"kind\": \"" + json_text(kind) +
                  "\",\n  \"devices\": [";
  for (size_t i = 0; i < devices.size(); ++i) {
    const QuotaDevice& d = devices[i];
    const std::string declared = "cxlpool:backing=pool:" + d.quota + "@" + location;
    j += std::string(i ? "," : "") + "\n    {\n      \"name\": \"" + json_text(d.name) +
         "\",\n      \"containerEdits\": {\n        \"env\": [\n";
    j += "          \"CXLPOOL_POOL=" + json_text(location) + "\",\n";
    j += "          \"CXLPOOL_QUOTA=" + json_text(d.quota) + "\",\n";
    j += "          \"CXLPOOL_QUOTA_KEY=" + d.key + "\",\n";
    j += "          \"CXLPOOL_DEVICES=" + json_text(declared) + "\"\n        ],\n";
    if (obj.device_node) {
      j += "        \"deviceNodes\": [\n          {\"path\": \"" + json_text(obj.path) + "\"}\n        ]\n";
    } else {
      j += "        \"mounts\": [\n          {\"hostPath\": \"" + json_text(obj.path) + "\", \"containerPath\": \"" +
           json_text(obj.path) + "\", \"options\": [\"bind\", \"rw\", \"nosuid\", \"nodev\", \"noexec\"]}\n        ]\n";
    }
    j += "      }\n    }";
  }
  j += "\n  ]\n}\n";
  return j;
}

// The spec's file name in its directory: one per kind and pool location (a hash of the whole
// location tells apart pools whose names look alike once made safe for a file name).
inline std::string file_name(const std::string& kind, const std::string& label, const std::string& location) {
  uint64_t h = 0xcbf29ce484222325u;  // FNV-1a
  for (unsigned char c : location) h = (h ^ c) * 0x100000001b3u;
  char hex[17];
  snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  std::string n;
  for (char c : kind + "_" + label) n += alnum(c) || c == '-' ? c : '_';
  return n + "-" + hex + ".json";
}

inline constexpr const char* kTempPrefix = ".cxlpool-cdi.";

// A spec's place, made ready before any key changes: the directory (owned by us or root, not
// writable by others: no one else can swap names in it), the target checked (absent, or a
// spec this tool wrote, owned by us), and the temporary file created; commit() writes and
// renames it. Temporary files of runs that were killed (their pid gone) are removed.
class SpecSite {
 public:
  SpecSite() = default;
  SpecSite(const SpecSite&) = delete;
  SpecSite& operator=(const SpecSite&) = delete;
  ~SpecSite() {
    if (temp_fd_ >= 0) close(temp_fd_);
    if (!temp_.empty()) unlinkat(dir_fd_, temp_.c_str(), 0);
    if (dir_fd_ >= 0) close(dir_fd_);
  }
  // "" when ready, else why not (nothing was changed).
  static std::string open_dir(const std::string& given, bool create, int* out) {
    std::string dir = given;  // "link/" would follow a link that "link" refuses
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    if (create) mkdir(dir.c_str(), 0755);  // (the default CDI directory only)
    const int d = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (d < 0)
      return dir + ": " + strerror(errno) +
             (errno == ENOENT ? " (the CDI directory must exist: podman reads /etc/cdi and /var/run/cdi)"
              : errno == ELOOP || errno == ENOTDIR ? " (not a directory, or a symbolic link: left alone)"
                                                   : "");
    struct stat st {};
    if (fstat(d, &st) != 0 || (st.st_uid != geteuid() && st.st_uid != 0) || (st.st_mode & 022) != 0) {
      close(d);
      return dir + " belongs to another user or is writable by others; a spec holds keys and is written only in " +
             "a directory no one else can change";
    }
    *out = d;
    return "";
  }
  std::string prepare(const std::string& dir, bool create_dir, const std::string& name, const std::string& kind) {
    dir_ = dir;
    name_ = name;
    std::string why = open_dir(dir, create_dir, &dir_fd_);
    if (!why.empty()) return why;
    // One cdi at a time per directory, from its checks to its rename: two runs on one pool
    // would otherwise each lock with a new key and the later rename could carry the older.
    while (flock(dir_fd_, LOCK_EX) != 0)
      if (errno != EINTR) return dir + ": cannot lock the directory: " + strerror(errno);
    sweep_stale_temps();
    why = check_target(dir_fd_, dir, name, kind);
    if (!why.empty()) return why;
    for (int attempt = 0; temp_fd_ < 0 && attempt < 100; ++attempt) {
      temp_ = std::string(kTempPrefix) + std::to_string(getpid()) + "." + std::to_string(attempt);
      temp_fd_ = openat(dir_fd_, temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
      if (temp_fd_ < 0 && errno != EEXIST) {
        const std::string e = dir + "/" + temp_ + ": " + strerror(errno);
        temp_.clear();
        return e;
      }
    }
    if (temp_fd_ < 0) {
      temp_.clear();
      return dir + ": no temporary name was free";
    }
    return "";
  }
  // Device names another spec of the same kind already uses, in this directory or in the
  // others the runtime reads (podman: /etc/cdi and /var/run/cdi; the later one silently wins):
  // "" if none. Loosely matched, so a spec written by hand (JSON of any layout, or YAML) is
  // seen too; a false match only refuses, naming the file.
  std::string taken_name(const std::string& kind, const std::vector<std::string>& names) const {
    std::string hit = taken_in(dir_fd_, dir_, name_, kind, names);
    for (const char* other : {"/etc/cdi", "/var/run/cdi"}) {
      if (!hit.empty()) break;
      const int d = open(other, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (d < 0) continue;
      struct stat a {
      }, b{};
      if (fstat(d, &a) == 0 && fstat(dir_fd_, &b) == 0 && (a.st_dev != b.st_dev || a.st_ino != b.st_ino))
        hit = taken_in(d, other, "", kind, names);
      close(d);
    }
    return hit;
  }
  static std::string taken_in(int dir_fd, const std::string& dir, const std::string& skip, const std::string& kind,
                              const std::vector<std::string>& names) {
    DIR* d = fdopendir(dup(dir_fd));
    if (!d) return "";
    rewinddir(d);  // a dup shares the offset another listing left at the end
    std::string hit;
    auto ends = [](const std::string& f, const char* ext) {
      const size_t n = strlen(ext);
      return f.size() > n && f.compare(f.size() - n, n, ext) == 0;
    };
    while (dirent* e = readdir(d)) {
      const std::string f = e->d_name;
      if (f == skip || !(ends(f, ".json") || ends(f, ".yaml") || ends(f, ".yml"))) continue;
      const int fd = openat(dir_fd, f.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
      if (fd < 0) continue;
      const std::string text = read_head(fd);
      close(fd);
      if (text.find(kind) == std::string::npos) continue;
      for (const auto& n : names) {
        const bool quoted = text.find("\"" + n + "\"") != std::string::npos;
        const bool yaml =
            text.find(": " + n + "\n") != std::string::npos || text.find(":" + n + "\n") != std::string::npos;
        if (quoted || yaml) hit = n + " (in " + dir + "/" + f + ")";
      }
    }
    closedir(d);
    return hit;
  }
  // Writes text (the spec with stand-in keys of the real keys' length) and flushes it, so that
  // the room the spec needs is taken before any key changes: a full filesystem fails here.
  std::string reserve(const std::string& text) { return write_at_start(text, true); }
  // Writes the final text over what reserve() wrote (the same length: no new room needed),
  // flushes it and renames it over the target. "" or why not (nothing written).
  std::string commit(const std::string& text) {
    std::string why = write_at_start(text, false);
    if (!why.empty()) return why;
    close(temp_fd_);
    temp_fd_ = -1;
    if (renameat(dir_fd_, temp_.c_str(), dir_fd_, name_.c_str()) != 0)
      return dir_ + "/" + name_ + ": " + strerror(errno) + " (nothing written)";
    temp_.clear();
    fsync(dir_fd_);
    return "";
  }

  static std::string read_head(int fd) {
    std::string text;
    char buf[4096];
    for (ssize_t n; text.size() < (1u << 20) && (n = read(fd, buf, sizeof buf)) > 0;) text.append(buf, size_t(n));
    return text;
  }
  // Whether the file open at fd is a spec this tool wrote: a regular file of ours, one link,
  // with the kind and the key variable in it.
  static bool ours(int fd, const std::string& kind) {
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1 || st.st_uid != geteuid()) return false;
    const std::string text = read_head(fd);
    return text.find("\"kind\": \"" + json_text(kind) + "\"") != std::string::npos &&
           text.find("\"CXLPOOL_QUOTA_KEY=") != std::string::npos;
  }
  static std::string check_target(int d, const std::string& dir, const std::string& name, const std::string& kind) {
    const int old = openat(d, name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (old >= 0) {
      const bool mine = ours(old, kind);
      close(old);
      if (!mine)
        return dir + "/" + name + " exists and is not a spec cxlpool-compose wrote; it is left alone (remove it " +
               "or choose another --kind)";
    } else if (errno != ENOENT) {
      return dir + "/" + name + ": " + strerror(errno) + " (a symbolic link or something else: left alone)";
    }
    return "";
  }

 private:
  std::string write_at_start(const std::string& text, bool sized) {
    if (sized && ftruncate(temp_fd_, off_t(text.size())) != 0)
      return dir_ + "/" + temp_ + ": " + strerror(errno) + " (nothing written)";
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = pwrite(temp_fd_, text.data() + done, text.size() - done, off_t(done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return dir_ + "/" + temp_ + ": " + strerror(n < 0 ? errno : EIO) + " (nothing written)";
      done += size_t(n);
    }
    if (fsync(temp_fd_) != 0) return dir_ + "/" + temp_ + ": " + strerror(errno) + " (nothing written)";
    return "";
  }

  // Temporary files of this tool whose writer is gone (killed between create and rename).
  void sweep_stale_temps() {
    DIR* d = fdopendir(dup(dir_fd_));
    if (!d) return;
    rewinddir(d);
    const size_t plen = strlen(kTempPrefix);
    const time_t now = time(nullptr);
    while (dirent* e = readdir(d)) {
      const std::string f = e->d_name;
      if (f.compare(0, plen, kTempPrefix) != 0 || !isdigit(static_cast<unsigned char>(f[plen]))) continue;
      char* end = nullptr;
      const long pid = strtol(f.c_str() + plen, &end, 10);
      if (pid <= 0 || *end != '.' || kill(pid_t(pid), 0) == 0 || errno != ESRCH) continue;
      // A pid is this namespace's: a run in another one (a driver's container sharing the
      // directory) looks dead from here. Only a file left for ten minutes is taken as a
      // killed run's; a live run holds the directory's lock and is done in well under that.
      struct stat st {};
      if (fstatat(dir_fd_, f.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
          st.st_nlink == 1 && now - st.st_mtime > 600)
        unlinkat(dir_fd_, f.c_str(), 0);
    }
    closedir(d);
  }

  std::string dir_, name_, temp_;
  int dir_fd_ = -1, temp_fd_ = -1;
};

// Removes dir/name when it is a spec this tool wrote. Returns "" or why not.
inline std::string remove_spec(const std::string& dir, const std::string& name, const std::string& kind) {
  int d = -1;
  std::string why = SpecSite::open_dir(dir, false, &d);
  if (!why.empty()) return why;
  const int fd = openat(d, name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    why = dir + "/" + name + ": " + strerror(errno);
  } else {
    const bool mine = SpecSite::ours(fd, kind);
    close(fd);
    if (!mine)
      why = dir + "/" + name + " is not a spec cxlpool-compose wrote; it is left alone";
    else if (unlinkat(d, name.c_str(), 0) != 0)
      why = dir + "/" + name + ": " + strerror(errno);
  }
  close(d);
  return why;
}

}  // namespace cxlpool::tools::cdi
