// SPDX-License-Identifier: MIT
// Strict parser and canonical formatter for device declarations (CXLPOOL_DEVICES grammar).
// Every error names the origin, the device, the key and the offending token; a failure
// anywhere rejects the whole input, so nothing is half-created.
#include "config/device_spec.hpp"

#include "backing/provider.hpp"
#include "common/error.hpp"
#include "common/parse.hpp"
#include "os/os.hpp"

namespace cxlpool::detail {
namespace {

constexpr uint64_t kMaxSize = uint64_t(1) << 50;    // 1 PiB: beyond any device we can map
constexpr uint64_t kMaxLatencyNs = 100'000'000;     // 100 ms
constexpr uint64_t kMaxBandwidthMbps = 10'000'000;  // 10 TB/s
constexpr int kMaxTier = 15;

const char* const kValidKeys =
    "backing, size, max_size, latency, read_latency, write_latency, bandwidth, read_bandwidth, write_bandwidth, tier, "
    "fork";

std::string quote(std::string_view s) { return "'" + std::string(s) + "'"; }

[[noreturn]] void config_error(const std::string& where, const std::string& what) {
  fail(CXLPOOL_E_CONFIG, where + ": " + what);
}

bool valid_name(std::string_view n) {
  if (n.empty() || n.size() > 31) return false;
  if (!std::isalpha(static_cast<unsigned char>(n[0]))) return false;
  for (char c : n)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) return false;
  return true;
}

// Names that discovered targets use ("node3", "dax0.0") cannot be declared.
bool reserved_name(std::string_view n) {
  auto all_digits = [](std::string_view s) {
    return !s.empty() && s.find_first_not_of("0123456789") == std::string_view::npos;
  };
  if (n.substr(0, 4) == "node" && all_digits(n.substr(4))) return true;
  if (n == "near" || n == "far" || (n.substr(0, 4) == "tier" && all_digits(n.substr(4)))) return true;  // policy words
  if (n.substr(0, 3) == "dax") {
    auto rest = n.substr(3);
    auto dot = rest.find('.');
    if (dot != std::string_view::npos && all_digits(rest.substr(0, dot)) && all_digits(rest.substr(dot + 1)))
      return true;
  }
  return false;
}

// The backing's text is the one location grammar of the providers (backing/provider.hpp).
void parse_backing(DeviceSpec& d, std::string_view v, const std::string& where) {
  BackingSpec loc;
  const std::string why = parse_location(v, &loc);
  if (!why.empty()) config_error(where, why);
  d.backing = loc.kind;
  d.numa_node = loc.numa_node;
  d.path = loc.path;
}

DeviceSpec parse_device(std::string_view entry, const std::string& origin) {
  entry = trim(entry);
  auto colon = entry.find(':');
  if (colon == std::string_view::npos)
    config_error(origin, "device entry " + quote(entry) + " has no ':' (expected NAME:key=value,...)");
  std::string_view name = trim(entry.substr(0, colon));
  if (!valid_name(name))
    config_error(origin, "bad device name " + quote(name) +
                             " (1-31 characters: a letter, then letters, digits, '_', '-' or '.')");
  if (reserved_name(name))
    config_error(origin,
                 "device name " + quote(name) +
                     " is reserved (nodeN and daxX.Y name discovered targets; near, far and tierN are policy words)");
  DeviceSpec d;
  d.name = std::string(name);
  d.origin = origin;
  const std::string dev = origin + ": device " + quote(name);

  std::string_view body = trim(entry.substr(colon + 1));
  if (body.empty()) return d;
  // Canonical key -> spelling used, to reject duplicates including aliases.
  std::vector<std::pair<std::string, std::string>> seen;
  for (std::string_view kv : split(body, ',')) {
    kv = trim(kv);
    if (kv.empty()) config_error(dev, "empty key=value (stray ',')");
    auto eq = kv.find('=');
    if (eq == std::string_view::npos) config_error(dev, quote(kv) + " has no '=' (expected key=value)");
    std::string_view key = trim(kv.substr(0, eq));
    std::string_view val = trim(kv.substr(eq + 1));
    const std::string where = dev + ": key " + quote(key);
    std::string canon;
    if (key == "backing" || key == "size" || key == "max_size" || key == "tier" || key == "read_latency" ||
        key == "write_latency" || key == "read_bandwidth" || key == "write_bandwidth" || key == "fork")
      canon = key;
    else if (key == "latency")
      canon = "read_latency";
    else if (key == "read_bw")
      canon = "read_bandwidth";
    else if (key == "write_bw")
      canon = "write_bandwidth";
    else if (key == "bandwidth")
      canon = "bandwidth";
    else if (key.empty())
      config_error(dev, "empty key in " + quote(kv));
    else
      config_error(dev, "unknown key " + quote(key) + " (valid keys: " + kValidKeys + ")");
    // "bandwidth" sets both directions, so it collides with either.
    for (auto& [c, spelled] : seen) {
      bool clash = c == canon || (canon == "bandwidth" && (c == "read_bandwidth" || c == "write_bandwidth")) ||
                   (c == "bandwidth" && (canon == "read_bandwidth" || canon == "write_bandwidth"));
      if (clash)
        config_error(
            where, spelled == std::string(key) ? "given twice" : "conflicts with " + quote(spelled) + " given earlier");
    }
    seen.emplace_back(canon, std::string(key));
    if (val.empty()) config_error(where, "empty value");

    if (canon == "backing") {
      parse_backing(d, val, where);
    } else if (canon == "size" || canon == "max_size") {
      auto v = parse_size(val);
      if (!v)
        config_error(where,
                     "bad size " + quote(val) + " (expected digits with an optional K, M, G or T suffix, e.g. 4G)");
      if (*v == 0) config_error(where, "size " + quote(val) + " must be greater than zero");
      if (*v > kMaxSize) config_error(where, "size " + quote(val) + " is too large (maximum 1024T)");
      (canon == "size" ? d.size : d.max_size) = v;
    } else if (canon == "read_latency" || canon == "write_latency") {
      auto v = parse_latency_ns(val);
      if (!v) config_error(where, "bad latency " + quote(val) + " (expected a number with ns or us, e.g. 250ns)");
      if (*v == 0 || *v > kMaxLatencyNs)
        config_error(where, "latency " + quote(val) + " is out of range (1ns..100000us)");
      (canon == "read_latency" ? d.read_latency_ns : d.write_latency_ns) = v;
    } else if (canon == "bandwidth" || canon == "read_bandwidth" || canon == "write_bandwidth") {
      auto v = parse_bandwidth_mbps(val);
      if (!v)
        config_error(where,
                     "bad bandwidth " + quote(val) + " (expected a number with MB/s, GB/s or TB/s, e.g. 30GB/s)");
      if (*v == 0 || *v > kMaxBandwidthMbps)
        config_error(where, "bandwidth " + quote(val) + " is out of range (1MB/s..10TB/s)");
      if (canon != "write_bandwidth") d.read_bandwidth_mbps = v;
      if (canon != "read_bandwidth") d.write_bandwidth_mbps = v;
    } else if (canon == "tier") {
      auto v = parse_u64(val);
      if (!v || *v > uint64_t(kMaxTier))
        config_error(where, "bad tier " + quote(val) + " (expected 0.." + std::to_string(kMaxTier) + ")");
      d.tier = int(*v);
    } else if (canon == "fork") {
      if (val != "cow" && val != "copy") config_error(where, "bad fork mode " + quote(val) + " (expected cow or copy)");
      d.fork_copy = val == "copy";
    }
  }
  if (d.max_size && d.size && *d.max_size < *d.size)
    config_error(dev + ": key 'max_size'", "max_size " + std::to_string(*d.max_size) + " is below size " +
                                               std::to_string(*d.size) + " (it bounds how far the device may grow)");
  if (d.fork_copy && !*d.fork_copy && d.backing == CXLPOOL_BACKING_DEVDAX)
    config_error(dev + ": key 'fork'", "'cow' is impossible on devdax (device-DAX cannot be mapped privately)");
  if (d.fork_copy && !*d.fork_copy && d.backing == CXLPOOL_BACKING_POOL)
    config_error(dev + ": key 'fork'",
                 "'cow' is impossible on a pool device (its memory is a shared pool's, mapped shared)");
  return d;
}

void reject_duplicate_names(const std::vector<DeviceSpec>& devices) {
  for (size_t i = 0; i < devices.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (devices[i].name == devices[j].name)
        config_error(devices[i].origin,
                     "device " + quote(devices[i].name) + " is declared twice (first at " + devices[j].origin + ")");
}

}  // namespace

bool DeviceSpec::operator==(const DeviceSpec& o) const {
  return name == o.name && backing == o.backing && numa_node == o.numa_node && path == o.path && size == o.size &&
         max_size == o.max_size && read_latency_ns == o.read_latency_ns && write_latency_ns == o.write_latency_ns &&
         read_bandwidth_mbps == o.read_bandwidth_mbps && write_bandwidth_mbps == o.write_bandwidth_mbps &&
         tier == o.tier && fork_copy == o.fork_copy;
}

std::vector<DeviceSpec> parse_device_list(std::string_view text, const std::string& origin) {
  std::vector<DeviceSpec> out;
  if (trim(text).empty()) return out;
  size_t index = 0;
  for (std::string_view entry : split(text, ';')) {
    ++index;
    if (trim(entry).empty())
      config_error(origin, "empty device entry #" + std::to_string(index) + " (two ';' in a row, or a trailing ';')");
    out.push_back(parse_device(entry, origin));
  }
  reject_duplicate_names(out);
  return out;
}

std::vector<DeviceSpec> parse_device_lines(std::string_view text, const std::string& origin) {
  std::vector<DeviceSpec> out;
  size_t line_no = 0;
  for (std::string_view line : split(text, '\n')) {
    ++line_no;
    auto hash = line.find('#');
    if (hash != std::string_view::npos) line = line.substr(0, hash);
    line = trim(line);
    if (line.empty()) continue;
    const std::string where = origin + ":" + std::to_string(line_no);
    if (line.find(';') != std::string_view::npos)
      config_error(where, "one device per line in a config file (found ';')");
    out.push_back(parse_device(line, where));
  }
  reject_duplicate_names(out);
  return out;
}

std::vector<DeviceSpec> parse_device_file(const std::string& path) {
  std::string text;
  try {
    text = os::read_user_file(path);
  } catch (const Failure& f) {
    // read_user_file's messages name the path and what is wrong with it.
    fail(CXLPOOL_E_CONFIG, std::string("CXLPOOL_CONFIG: ") + f.what());
  }
  return parse_device_lines(text, path);
}

std::string format_backing(const DeviceSpec& d) {
  BackingSpec loc;
  loc.kind = d.backing;
  loc.numa_node = d.numa_node;
  loc.path = d.path;
  return format_location(loc);
}

std::string format_device(const DeviceSpec& d) {
  std::string s = d.name + ":backing=" + format_backing(d);
  if (d.size) s += ",size=" + std::to_string(*d.size);
  if (d.max_size) s += ",max_size=" + std::to_string(*d.max_size);
  if (d.read_latency_ns) s += ",read_latency=" + std::to_string(*d.read_latency_ns) + "ns";
  if (d.write_latency_ns) s += ",write_latency=" + std::to_string(*d.write_latency_ns) + "ns";
  if (d.read_bandwidth_mbps) s += ",read_bandwidth=" + std::to_string(*d.read_bandwidth_mbps) + "MB/s";
  if (d.write_bandwidth_mbps) s += ",write_bandwidth=" + std::to_string(*d.write_bandwidth_mbps) + "MB/s";
  if (d.tier) s += ",tier=" + std::to_string(*d.tier);
  if (d.fork_copy) s += std::string(",fork=") + (*d.fork_copy ? "copy" : "cow");
  return s;
}

}  // namespace cxlpool::detail
