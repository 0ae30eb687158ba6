// SPDX-License-Identifier: MIT
// The room there is for a device (os/room.hpp): the memory cgroup's limit read from fake
// cgroup trees (v2 along the path to the root, v1, none, hostile paths) and a filesystem's
// free bytes against statvfs.
#include "os/room.hpp"

#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

namespace {

// A scratch directory removed at the end of the test.
struct Tree {
  std::string root;
  Tree() {
    char tmpl[] = "/tmp/cxlpool-room-test-XXXXXX";
    REQUIRE(mkdtemp(tmpl));
    root = tmpl;
  }
  ~Tree() { std::system(("rm -rf '" + root + "'").c_str()); }
  void write(const std::string& rel, const std::string& text) const {
    std::string path = root + "/" + rel;
    std::system(("mkdir -p '" + path.substr(0, path.find_last_of('/')) + "'").c_str());
    std::ofstream(path) << text;
  }
};

constexpr uint64_t kMiB = uint64_t(1) << 20;

}  // namespace

TEST_CASE("cgroup v2: the ancestor with the least room under its limit decides", "[unit]") {
  Tree t;
  t.write("proc-cgroup", "0::/app/job\n");
  t.write("fs/cgroup.controllers", "cpu memory\n");
  t.write("fs/app/job/memory.max", "max\n");  // no limit of its own
  t.write("fs/app/job/memory.current", std::to_string(10 * kMiB) + "\n");
  t.write("fs/app/memory.max", std::to_string(512 * kMiB) + "\n");
  t.write("fs/app/memory.current", std::to_string(480 * kMiB) + "\n");  // 32 MiB left: the tightest
  t.write("fs/memory.max", std::to_string(4096 * kMiB) + "\n");         // the root has none in v2; ignored if odd
  t.write("fs/memory.current", std::to_string(100 * kMiB) + "\n");
  cxlpool::os::CgroupRoom r;
  REQUIRE(cxlpool::os::memory_cgroup_room(&r, t.root + "/proc-cgroup", t.root + "/fs"));
  CHECK(r.limit == 512 * kMiB);
  CHECK(r.usage == 480 * kMiB);
  CHECK(r.path == t.root + "/fs/app/memory.max");
}

TEST_CASE("cgroup v2 in a hybrid hierarchy is read below unified/", "[unit]") {
  Tree t;
  t.write("proc-cgroup", "4:memory:/\n0::/svc\n");
  t.write("fs/unified/svc/memory.max", std::to_string(64 * kMiB) + "\n");
  t.write("fs/unified/svc/memory.current", std::to_string(70 * kMiB) + "\n");  // over: no room at all
  cxlpool::os::CgroupRoom r;
  REQUIRE(cxlpool::os::memory_cgroup_room(&r, t.root + "/proc-cgroup", t.root + "/fs"));
  CHECK(r.limit == 64 * kMiB);
  CHECK(r.usage == 70 * kMiB);
}

TEST_CASE("cgroup v1: memory.limit_in_bytes, whose 'unlimited' is no limit", "[unit]") {
  Tree t;
  t.write("proc-cgroup", "9:cpu,cpuacct:/x\n4:memory:/jobs/a\n0::/\n");
  t.write("fs/memory/jobs/a/memory.limit_in_bytes", "9223372036854771712\n");
  t.write("fs/memory/jobs/a/memory.usage_in_bytes", "1000\n");
  t.write("fs/memory/memory.limit_in_bytes", "9223372036854771712\n");
  cxlpool::os::CgroupRoom r;
  CHECK_FALSE(cxlpool::os::memory_cgroup_room(&r, t.root + "/proc-cgroup", t.root + "/fs"));
  t.write("fs/memory/jobs/memory.limit_in_bytes", std::to_string(112 * kMiB) + "\n");
  t.write("fs/memory/jobs/memory.usage_in_bytes", std::to_string(12 * kMiB) + "\n");
  REQUIRE(cxlpool::os::memory_cgroup_room(&r, t.root + "/proc-cgroup", t.root + "/fs"));
  CHECK(r.limit == 112 * kMiB);
  CHECK(r.usage == 12 * kMiB);
}

TEST_CASE("no memory cgroup, garbage and paths leaving the mount mean no limit", "[unit]") {
  Tree t;
  cxlpool::os::CgroupRoom r;
  CHECK_FALSE(cxlpool::os::memory_cgroup_room(&r, t.root + "/missing", t.root + "/fs"));
  t.write("proc-cgroup", "garbage without colons\n0::/../../etc\n");
  t.write("fs/cgroup.controllers", "memory\n");
  t.write("etc/memory.max", "1000\n");
  CHECK_FALSE(cxlpool::os::memory_cgroup_room(&r, t.root + "/proc-cgroup", t.root + "/fs"));
  t.write("proc-cgroup", "0::/a\n");
  t.write("fs/a/memory.max", "12abc\n");
  CHECK_FALSE(cxlpool::os::memory_cgroup_room(&r, t.root + "/proc-cgroup", t.root + "/fs"));
}

TEST_CASE("a filesystem's room is statvfs's f_bavail", "[unit]") {
  cxlpool::os::FsRoom room;
  REQUIRE(cxlpool::os::filesystem_room("/tmp", &room));
  struct statvfs sv {};
  REQUIRE(statvfs("/tmp", &sv) == 0);
  const uint64_t expect = uint64_t(sv.f_bavail) * sv.f_frsize;
  CHECK(room.huge_page == 0);
  CHECK(room.bytes + 64 * kMiB >= expect);  // others may write meanwhile
  CHECK(room.bytes <= expect + 64 * kMiB);
  CHECK_FALSE(cxlpool::os::filesystem_room("/nonexistent-cxlpool-dir", &room));
}
