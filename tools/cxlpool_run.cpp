// SPDX-License-Identifier: MIT
// cxlpool-run: runs a program with every allocation on cxlpool's tiers, like numactl for
// memory tiers: sets LD_PRELOAD=libcxlpool_preload.so, CXLPOOL_DEVICES, CXLPOOL_POLICY and
// CXLPOOL_STATS, then execs. Warns when the program is static or setuid/setgid (preloading
// cannot work there), and says once, for the whole process tree, when tiering runs without
// write fences (os/write_fence.hpp: which moves are off, why, and the knob that turns them
// on). Configuration errors are reported by the interposer itself (one line, then the program
// runs with default placement).
#include <elf.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "os/write_fence.hpp"
#include "tiering/config.hpp"
#include "topology/model.hpp"

#ifndef CXLPOOL_PRELOAD_INSTALL_PATH
#define CXLPOOL_PRELOAD_INSTALL_PATH ""
#endif
#ifndef CXLPOOL_PRELOAD_NAME  // the file name the loader knows it by: libcxlpool_preload.so.<soversion>
#define CXLPOOL_PRELOAD_NAME "libcxlpool_preload.so"
#endif
#ifndef CXLPOOL_LIBDIR_FROM_BINDIR  // the install layout: bin/ -> lib/<multiarch>/ (GNUInstallDirs)
#define CXLPOOL_LIBDIR_FROM_BINDIR "../lib"
#endif

namespace {

const char* kUsage =
    "usage: cxlpool-run [--devices SPEC] [--policy SPEC] [--tiering[=SPEC]] [--stats[=FILE]] [--preload LIB] [--] "
    "PROGRAM\n"
    "       [ARGS...]\n"
    "Runs PROGRAM with its malloc and operator new served by cxlpool (LD_PRELOAD of libcxlpool_preload.so).\n"
    "  --devices SPEC   devices, as CXLPOOL_DEVICES (docs/config.md)\n"
    "  --policy SPEC    placement policy, as CXLPOOL_POLICY (docs/policy.md), e.g. threshold:size=1M,tier=far\n"
    "  --tiering[=SPEC] run the tiering engine, as CXLPOOL_TIERING (docs/tiering.md), e.g.\n"
    "                   budget=200MB/s,interval=100ms; a bad SPEC is reported by the program's interposer\n"
    "  --stats[=FILE]   print per-device statistics at exit (stderr, or FILE)\n"
    "  --preload LIB    the interposer library to use (default: the lib directory beside this tool's bin\n"
    "                   directory, then the install path)\n";

bool exists(const std::string& p) { return !p.empty() && access(p.c_str(), R_OK) == 0; }

std::string find_preload(const char* argv0) {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    self[n] = 0;
    std::string dir(self);
    dir = dir.substr(0, dir.find_last_of('/'));
    // Installed (the layout this tool was built for, e.g. /usr/bin -> /usr/lib/x86_64-linux-gnu,
    // wherever the tree was moved), then the build tree (tools/ -> lib/), then common layouts.
    // (No build-tree path is compiled in: the installed tool must never load from there.)
    for (const char* rel : {"/" CXLPOOL_LIBDIR_FROM_BINDIR "/", "/../lib/", "/../lib64/", "/../lib/x86_64-linux-gnu/"})
      for (const char* name : {CXLPOOL_PRELOAD_NAME, "libcxlpool_preload.so"})
        if (exists(dir + rel + name)) return dir + rel + name;
  }
  (void)argv0;
  if (exists(CXLPOOL_PRELOAD_INSTALL_PATH)) return CXLPOOL_PRELOAD_INSTALL_PATH;
  return "";
}

std::string resolve(const std::string& prog) {
  if (prog.empty()) return "";
  if (prog.find('/') != std::string::npos) return access(prog.c_str(), F_OK) == 0 ? prog : "";
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find(':', start);
    std::string dir = p.substr(start, end == std::string::npos ? std::string::npos : end - start);
    std::string cand = (dir.empty() ? "." : dir) + "/" + prog;
    struct stat st {};
    if (access(cand.c_str(), X_OK) == 0 && stat(cand.c_str(), &st) == 0 && S_ISREG(st.st_mode)) return cand;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return "";
}

// Static executables have no PT_INTERP: the dynamic loader never runs, LD_PRELOAD is moot.
bool is_static_elf(const std::string& path, bool& is_elf) {
  is_elf = false;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  Elf64_Ehdr eh;
  bool stat_elf = false;
  if (read(fd, &eh, sizeof eh) == ssize_t(sizeof eh) && std::memcmp(eh.e_ident, ELFMAG, SELFMAG) == 0 &&
      eh.e_ident[EI_CLASS] == ELFCLASS64) {
    is_elf = true;
    bool interp = false;
    for (int i = 0; i < eh.e_phnum; ++i) {
      Elf64_Phdr ph;
      if (pread(fd, &ph, sizeof ph, off_t(eh.e_phoff + uint64_t(i) * eh.e_phentsize)) != ssize_t(sizeof ph)) break;
      if (ph.p_type == PT_INTERP) interp = true;
    }
    stat_elf = !interp;
  }
  close(fd);
  return stat_elf;
}

// Declared devices larger than the room there is for them (a filesystem, huge pages, a memory
// cgroup), said once here rather than by every process of the program. Configuration errors
// stay the interposer's to report.
void warn_about_room() {
  try {
    cxlpool::detail::DiscoverOptions o;
    o.no_hwloc = true;
    for (const std::string& w : cxlpool::detail::discover(o).room_warnings)
      std::fprintf(stderr, "cxlpool-run: warning: %s\n", w.c_str());
  } catch (...) {
  }
}

// One line on stderr when the tiering engine the program will run cannot have write fences
// (the same probe the engine makes: this process has the program's credentials). Nothing for
// a SPEC the interposer will refuse (it says so itself) or one that moves nothing.
void say_fence_mode(const std::string& spec) {
  try {
    const cxlpool::detail::tiering::Config c = cxlpool::detail::tiering::parse_config(spec, "CXLPOOL_TIERING");
    if (!c.enabled || !c.migrate) return;
  } catch (...) {
    return;
  }
  const cxlpool::os::write_fence::Probe p = cxlpool::os::write_fence::probe();
  if (p.mode == cxlpool::os::write_fence::Mode::kKernel) return;
  std::fprintf(stderr, "cxlpool-run: tiering degraded: %s\n", cxlpool::os::write_fence::explain(p).c_str());
}

}  // namespace

int main(int argc, char** argv) {
  std::string devices, policy, stats, preload, tiering;
  bool have_devices = false, have_policy = false;
  int i = 1;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* opt) -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "cxlpool-run: %s needs an argument\n%s", opt, kUsage);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--") {
      ++i;
      break;
    } else if (a == "--devices") {
      devices = value("--devices");
      have_devices = true;
    } else if (a == "--policy") {
      policy = value("--policy");
      have_policy = true;
    } else if (a == "--stats") {
      stats.assign(1, '1');  // (assigning a literal trips a GCC 12 -Wrestrict false positive at -O3)
    } else if (a.rfind("--stats=", 0) == 0) {
      stats = a.substr(8);
      if (stats.empty()) {
        std::fprintf(stderr, "cxlpool-run: --stats= needs a file name\n");
        return 2;
      }
    } else if (a == "--tiering") {
      tiering = "on";
    } else if (a.rfind("--tiering=", 0) == 0) {
      tiering = a.substr(10);
      if (tiering.empty()) {
        std::fprintf(stderr, "cxlpool-run: --tiering= needs a specification (or use --tiering)\n");
        return 2;
      }
    } else if (a == "--preload") {
      preload = value("--preload");
    } else if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "cxlpool-run: unknown option '%s'\n%s", a.c_str(), kUsage);
      return 2;
    } else {
      break;
    }
  }
  if (i >= argc) {
    std::fprintf(stderr, "cxlpool-run: no program given\n%s", kUsage);
    return 2;
  }
  if (preload.empty()) preload = find_preload(argv[0]);
  if (!exists(preload)) {
    std::fprintf(stderr, "cxlpool-run: cannot find %s beside this tool nor as %s (give --preload LIB)\n",
                 CXLPOOL_PRELOAD_NAME, CXLPOOL_PRELOAD_INSTALL_PATH);
    return 2;
  }
  if (preload[0] != '/') {
    char cwd[4096];
    if (getcwd(cwd, sizeof cwd)) preload = std::string(cwd) + "/" + preload;
  }

  std::string path = resolve(argv[i]);
  if (path.empty()) {
    std::fprintf(stderr, "cxlpool-run: %s: command not found\n", argv[i]);
    return 127;
  }
  bool is_elf = false;
  if (is_static_elf(path, is_elf))
    std::fprintf(stderr, "cxlpool-run: warning: %s is statically linked; LD_PRELOAD has no effect on it\n",
                 path.c_str());
  struct stat st {};
  if (stat(path.c_str(), &st) == 0 && (st.st_mode & (S_ISUID | S_ISGID)))
    std::fprintf(stderr,
                 "cxlpool-run: warning: %s is setuid/setgid; the dynamic loader ignores LD_PRELOAD paths with "
                 "slashes for it, so it runs on glibc's malloc\n",
                 path.c_str());

  std::string ld = preload;
  if (const char* old = std::getenv("LD_PRELOAD"); old && *old) ld += std::string(":") + old;
  setenv("LD_PRELOAD", ld.c_str(), 1);
  if (have_devices) setenv("CXLPOOL_DEVICES", devices.c_str(), 1);
  if (have_policy) setenv("CXLPOOL_POLICY", policy.c_str(), 1);
  if (!stats.empty()) setenv("CXLPOOL_STATS", stats.c_str(), 1);
  if (!tiering.empty()) setenv("CXLPOOL_TIERING", tiering.c_str(), 1);
  warn_about_room();
  if (const char* spec = std::getenv("CXLPOOL_TIERING"); spec && *spec) say_fence_mode(spec);
  execv(path.c_str(), argv + i);
  int err = errno;
  std::fprintf(stderr, "cxlpool-run: cannot execute %s: %s\n", path.c_str(), std::strerror(err));
  return err == ENOENT ? 127 : 126;  // as shells do
}
