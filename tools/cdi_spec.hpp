// SPDX-License-Identifier: MIT
// A shared pool's quotas handed to containers: the CDI spec (Container Device Interface,
// cdiVersion 0.5.0, what podman 4.3 and Kubernetes DRA drivers give the runtime) that names
// one device per quota, and its safe writing. Header-only, over the public C API; used by
// cxlpool-compose cdi (docs/compose.md, "Containers"; docs/kubernetes.md).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
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
  if (location.find_first_of(",;=#\n") != std::string::npos) {
    *why = "the location \"" + location +
           "\" holds one of , ; = # or a newline, which CXLPOOL_DEVICES cannot carry: rename the pool";
    return {};
  }
  return h;
}

// A CDI device name: letters, digits, '_', '-', '.', ':' (the CDI grammar), at most 63 here.
inline bool valid_device_name(const std::string& n) {
  if (n.empty() || n.size() > 63 || !isalnum(static_cast<unsigned char>(n[0]))) return false;
  for (char c : n)
    if (!isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.' && c != ':') return false;
  return true;
}
// A kind: VENDOR/CLASS, VENDOR a domain-like name, CLASS letters, digits, '_', '-', '.'.
inline bool valid_kind(const std::string& k) {
  const size_t slash = k.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == k.size() || k.size() > 128) return false;
  for (size_t i = 0; i < k.size(); ++i) {
    const char c = k[i];
    if (i == slash) continue;
    if (!isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.') return false;
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

// The spec's file name in its directory: one per kind and pool.
inline std::string file_name(const std::string& kind, const std::string& device_prefix) {
  std::string n;
  for (char c : kind + "_" + device_prefix) n += isalnum(static_cast<unsigned char>(c)) || c == '-' ? c : '_';
  return n + ".json";
}

// Whether an existing file is a spec this tool wrote (its kind line and its env names), read
// through fd. Anything else in the spec directory belongs to someone else.
inline bool ours(int fd, const std::string& kind) {
  std::string text;
  char buf[4096];
  for (ssize_t n; text.size() < (1u << 20) && (n = read(fd, buf, sizeof buf)) > 0;) text.append(buf, size_t(n));
  return text.find("\"kind\": \"" + json_text(kind) + "\"") != std::string::npos &&
         text.find("\"CXLPOOL_QUOTA_KEY=") != std::string::npos;
}

// Writes text as dir/name, atomically (a temporary file made in dir, then renamed), readable
// by root only (the spec holds keys). An existing dir/name is replaced only when it is a
// regular file this tool wrote; the directory itself must exist and is never a link followed.
// Returns "" or why not.
inline std::string write_spec(const std::string& dir, const std::string& name, const std::string& kind,
                              const std::string& text) {
  const int d = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
  if (d < 0)
    return dir + ": " + strerror(errno) +
           (errno == ENOENT ? " (the CDI directory must exist: podman reads /etc/cdi and /var/run/cdi)" : "");
  auto fail = [&](const std::string& why) {
    close(d);
    return why;
  };
  const int old = openat(d, name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (old >= 0) {
    struct stat st {};
    const bool regular = fstat(old, &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 1;
    const bool mine = regular && ours(old, kind);
    close(old);
    if (!mine)
      return fail(dir + "/" + name + " exists and is not a spec cxlpool-compose wrote; it is left alone (remove it " +
                  "or choose another --kind)");
  } else if (errno != ENOENT) {
    return fail(dir + "/" + name + ": " + strerror(errno) + " (a symbolic link or something else: left alone)");
  }
  std::string temp;
  int fd = -1;
  for (int attempt = 0; fd < 0 && attempt < 100; ++attempt) {
    temp = "." + name + ".tmp." + std::to_string(getpid()) + "." + std::to_string(attempt);
    fd = openat(d, temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0 && errno != EEXIST) return fail(dir + "/" + temp + ": " + strerror(errno));
  }
  if (fd < 0) return fail(dir + ": no temporary name was free");
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = dir + "/" + temp + ": " + strerror(n < 0 ? errno : EIO);
      close(fd);
      unlinkat(d, temp.c_str(), 0);
      return fail(why + " (nothing written)");
    }
    done += size_t(n);
  }
  if (fsync(fd) != 0 || close(fd) != 0) {
    const std::string why = dir + "/" + temp + ": " + strerror(errno);
    unlinkat(d, temp.c_str(), 0);
    return fail(why + " (nothing written)");
  }
  if (renameat(d, temp.c_str(), d, name.c_str()) != 0) {
    const std::string why = dir + "/" + name + ": " + strerror(errno);
    unlinkat(d, temp.c_str(), 0);
    return fail(why + " (nothing written)");
  }
  close(d);
  return "";
}

// Removes dir/name when it is a spec this tool wrote. Returns "" or why not.
inline std::string remove_spec(const std::string& dir, const std::string& name, const std::string& kind) {
  const int d = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
  if (d < 0) return dir + ": " + strerror(errno);
  const int fd = openat(d, name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  std::string why;
  if (fd < 0) {
    why = dir + "/" + name + ": " + strerror(errno);
  } else {
    struct stat st {};
    const bool mine = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 1 && ours(fd, kind);
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
