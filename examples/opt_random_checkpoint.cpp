// SPDX-License-Identifier: MIT
// Writes an OPT checkpoint of random weights (a seed; no download): DIR/model.safetensors with
// Hugging Face names and DIR/config.json. For the tests, the demo and trying the servers.
//   opt_random_checkpoint DIR [--shape tiny|opt-125m] [--layers N --hidden D --heads H --ffn F
//       --vocab V --max-pos P] [--seed 1] [--dtype f16|bf16|f32]
#include <sys/stat.h>

#include "engine/checkpoint_writer.hpp"
#include "opt_common.hpp"

using namespace cxlpool::engine;
using namespace opt_example;

int main(int argc, char** argv) {
  const char* usage =
      "opt_random_checkpoint DIR [--shape tiny|opt-125m] [--layers N] [--hidden D] [--heads H] [--ffn F] "
      "[--vocab V] [--max-pos P] [--seed S] [--dtype f16|bf16|f32]";
  if (argc < 2 || argv[1][0] == '-') {
    std::fprintf(stderr, "usage: %s\n", usage);
    return 2;
  }
  const std::string dir = argv[1];
  const auto o = parse_options(
      argc - 1, argv + 1, {"shape", "layers", "hidden", "heads", "ffn", "vocab", "max-pos", "seed", "dtype"}, usage);
  try {
    OptConfig c{32, 4, 2, 64, 97, 256};  // tiny
    if (o.count("shape") && o.at("shape") == "opt-125m") {
      c = OptConfig{768, 12, 12, 3072, 50272, 2048};
    } else if (o.count("shape") && o.at("shape") != "tiny") {
      fail("--shape " + o.at("shape") + ": tiny or opt-125m");
    }
    c.layers = uint32_t(number(o, "layers", c.layers));
    c.hidden = uint32_t(number(o, "hidden", c.hidden));
    c.heads = uint32_t(number(o, "heads", c.heads));
    c.ffn = uint32_t(number(o, "ffn", c.ffn));
    c.vocab = uint32_t(number(o, "vocab", c.vocab));
    c.max_positions = uint32_t(number(o, "max-pos", c.max_positions));
    const std::string dt = o.count("dtype") ? o.at("dtype") : "f16";
    const Dtype d = dt == "f32" ? Dtype::kF32 : dt == "bf16" ? Dtype::kBF16 : Dtype::kF16;
    if (dt != "f32" && dt != "bf16" && dt != "f16") fail("--dtype " + dt + ": f16, bf16 or f32");
    mkdir(dir.c_str(), 0755);  // may exist
    write_opt_checkpoint(dir, random_opt_weights(c, number(o, "seed", 1, UINT64_MAX)), d);
    std::printf("%s: %s, %s\n", dir.c_str(), c.describe().c_str(), dtype_name(d));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "opt_random_checkpoint: %s\n", describe(e).c_str());
    return 1;
  }
  return 0;
}
