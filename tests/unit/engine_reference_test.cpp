// SPDX-License-Identifier: MIT
// The engine against a library-free reference: plain loops over plain arrays, a KV cache of
// its own (std::vector per layer), written from the OPT definition (Hugging Face's
// OPTDecoder, do_layer_norm_before=True). Tiny random models (seeded) written as fp32, fp16
// and bf16 safetensors checkpoints and loaded back (the loaded weights equal the rounded
// originals bit for bit); keys and values in cxlpool KV blocks as fp32, fp16 and bf16 (the
// reference rounds its own cache the same way). Every prompt position's logits and every decode
// step's equal the reference within fp tolerance. Then the properties the servers rely on,
// bit for bit: a decode over an imported view + a sequence of its own equals one sequence;
// a prompt whose prefix blocks come from the prefix cache (fewer tokens computed) equals one
// computed from scratch; the generic and AVX2 kernels agree within rounding.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cxlpool/cxlpool.h"
#include "engine/checkpoint_writer.hpp"
#include "engine/error.hpp"
#include "engine/generate.hpp"
#include "engine/kernels.hpp"
#include "test_support.hpp"

using namespace cxlpool::engine;

namespace {

// ---- the reference: nothing of the engine below this line but the weights' arrays ----------

float round_fp16(float x) { return float(_Float16(x)); }  // the compiler's IEEE half, not ours
float round_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  std::memcpy(&x, &u, 4);
  return x;
}

struct RefLayer {
  std::vector<float> qw, qb, kw, kb, vw, vb, ow, ob, ln1w, ln1b, f1w, f1b, f2w, f2b, ln2w, ln2b;
};
struct RefModel {
  int d, heads, layers, ffn, vocab, maxpos;
  std::vector<float> tok, pos, lnfw, lnfb;
  std::vector<RefLayer> L;
  int kv_round;  // 0 none, 1 fp16, 2 bf16
};

struct RefCache {
  std::vector<std::vector<float>> k, v;  // per layer: position-major, d floats per position
};

void ref_ln(const float* x, int d, const float* w, const float* b, float* y) {
  double mean = 0, var = 0;
  for (int i = 0; i < d; ++i) mean += x[i];
  mean /= d;
  for (int i = 0; i < d; ++i) var += (x[i] - mean) * (x[i] - mean);
  var /= d;
  for (int i = 0; i < d; ++i) y[i] = float((x[i] - mean) / std::sqrt(var + 1e-5) * w[i] + b[i]);
}
void ref_linear(const float* x, int in, const std::vector<float>& w, const float* b, int out, float* y) {
  for (int o = 0; o < out; ++o) {
    double s = b ? b[o] : 0;
    for (int i = 0; i < in; ++i) s += double(x[i]) * w[size_t(o) * in + i];
    y[o] = float(s);
  }
}

// One token at position p through the model, its K/V appended to the cache; returns logits.
std::vector<float> ref_step(const RefModel& m, RefCache& c, int token, int p) {
  const int d = m.d, hd = d / m.heads;
  std::vector<float> x(d), h(d), q(d), k(d), v(d), a(d), f(m.ffn), t(d);
  for (int i = 0; i < d; ++i) x[i] = m.tok[size_t(token) * d + i] + m.pos[size_t(p + 2) * d + i];
  for (int l = 0; l < m.layers; ++l) {
    const RefLayer& L = m.L[l];
    ref_ln(x.data(), d, L.ln1w.data(), L.ln1b.data(), h.data());
    ref_linear(h.data(), d, L.qw, L.qb.data(), d, q.data());
    ref_linear(h.data(), d, L.kw, L.kb.data(), d, k.data());
    ref_linear(h.data(), d, L.vw, L.vb.data(), d, v.data());
    for (int i = 0; i < d; ++i) {
      q[i] *= 1.0f / std::sqrt(float(hd));
      if (m.kv_round == 1) k[i] = round_fp16(k[i]), v[i] = round_fp16(v[i]);
      if (m.kv_round == 2) k[i] = round_bf16(k[i]), v[i] = round_bf16(v[i]);
    }
    c.k[l].insert(c.k[l].end(), k.begin(), k.end());
    c.v[l].insert(c.v[l].end(), v.begin(), v.end());
    for (int hh = 0; hh < m.heads; ++hh) {
      std::vector<double> s(p + 1);
      double mx = -1e300;
      for (int j = 0; j <= p; ++j) {
        double dot = 0;
        for (int e = 0; e < hd; ++e) dot += double(q[hh * hd + e]) * c.k[l][size_t(j) * d + hh * hd + e];
        s[j] = dot;
        mx = std::max(mx, dot);
      }
      double sum = 0;
      for (int j = 0; j <= p; ++j) sum += (s[j] = std::exp(s[j] - mx));
      for (int e = 0; e < hd; ++e) {
        double o = 0;
        for (int j = 0; j <= p; ++j) o += s[j] / sum * c.v[l][size_t(j) * d + hh * hd + e];
        a[hh * hd + e] = float(o);
      }
    }
    ref_linear(a.data(), d, L.ow, L.ob.data(), d, t.data());
    for (int i = 0; i < d; ++i) x[i] += t[i];
    ref_ln(x.data(), d, L.ln2w.data(), L.ln2b.data(), h.data());
    ref_linear(h.data(), d, L.f1w, L.f1b.data(), m.ffn, f.data());
    for (float& e : f) e = std::max(e, 0.0f);
    ref_linear(f.data(), m.ffn, L.f2w, L.f2b.data(), d, t.data());
    for (int i = 0; i < d; ++i) x[i] += t[i];
  }
  ref_ln(x.data(), d, m.lnfw.data(), m.lnfb.data(), h.data());
  std::vector<float> logits(m.vocab);
  ref_linear(h.data(), d, m.tok, nullptr, m.vocab, logits.data());
  return logits;
}

// ---- test plumbing ----------------------------------------------------------------------

RefModel reference_of(const OptWeights& w, int kv_round) {
  const OptConfig& c = w.config;
  RefModel m{int(c.hidden),  int(c.heads),      int(c.layers), int(c.ffn),   int(c.vocab), int(c.max_positions),
             w.embed_tokens, w.embed_positions, w.final_ln_w,  w.final_ln_b, {},           kv_round};
  for (const auto& l : w.layers)
    m.L.push_back({l.q_w, l.q_b, l.k_w, l.k_b, l.v_w, l.v_b, l.out_w, l.out_b, l.attn_ln_w, l.attn_ln_b, l.fc1_w,
                   l.fc1_b, l.fc2_w, l.fc2_b, l.ffn_ln_w, l.ffn_ln_b});
  return m;
}

struct Pool {
  std::string device;
  cxlpool_shared_pool_t* pool = nullptr;
  Pool() {
    device = "shm:cxlpool-engtest-" + std::to_string(getpid()) + "-" +
             std::to_string(std::chrono::steady_clock::now().time_since_epoch().count() % 1000000007);
    cxlpool_shared_params_t* p = nullptr;
    REQUIRE(cxlpool_shared_params_create(&p) == CXLPOOL_OK);
    REQUIRE(cxlpool_shared_params_set_size(p, 64u << 20) == CXLPOOL_OK);
    REQUIRE(cxlpool_shared_pool_create(device.c_str(), p, 0, &pool) == CXLPOOL_OK);
    cxlpool_shared_params_destroy(p);
  }
  ~Pool() {
    cxlpool_shared_pool_close(pool);
    cxlpool_shared_pool_unlink(device.c_str());
  }
};

struct Arena {
  cxlpool_kv_arena_t* arena = nullptr;
  Arena(const cxlpool_kv_geometry_t& g, cxlpool_shared_pool_t* pool, bool prefix_cache) {
    cxlpool_kv_params_t* p = nullptr;
    REQUIRE(cxlpool_kv_params_create(&p) == CXLPOOL_OK);
    REQUIRE(cxlpool_kv_params_set_prefix_caching(p, prefix_cache) == CXLPOOL_OK);
    REQUIRE(cxlpool_kv_arena_create(&g, &pool, 1, p, &arena) == CXLPOOL_OK);
    cxlpool_kv_params_destroy(p);
  }
  ~Arena() { cxlpool_kv_arena_destroy(arena); }
};
struct Seq {
  cxlpool_kv_seq_t* seq = nullptr;
  explicit Seq(const Arena& a) { REQUIRE(cxlpool_kv_seq_create(a.arena, &seq) == CXLPOOL_OK); }
  ~Seq() { cxlpool_kv_seq_destroy(seq); }
};

void require_close(const std::vector<float>& got, const std::vector<float>& want, double atol, double rtol,
                   const std::string& what) {
  REQUIRE(got.size() == want.size());
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - want[i]) - rtol * std::fabs(double(want[i]));
    if (err > worst) worst = err, at = i;
  }
  INFO(what << ": worst excess error " << worst << " at " << at << " (got " << got[at] << ", want " << want[at] << ")");
  REQUIRE(worst <= atol);
}

std::vector<int32_t> random_prompt(std::mt19937& rng, size_t n, uint32_t vocab) {
  std::vector<int32_t> p(n);
  for (auto& t : p) t = int32_t(rng() % vocab);
  return p;
}

}  // namespace

TEST_CASE("engine equals the reference: checkpoints fp32/fp16/bf16, KV fp32/fp16/bf16", "[unit]") {
  cxlpool_test::ScratchDir dir;
  Pool pool;
  struct Shape {
    OptConfig c;
    uint32_t tokens_per_block;
  };
  // A regular shape and one with odd sizes (head_dim 5, ffn 37: every kernel's tail).
  const Shape shapes[] = {{{32, 4, 2, 64, 97, 64}, 4}, {{20, 4, 3, 37, 53, 48}, 3}};
  int seed = 0;
  for (const Shape& s : shapes) {
    const OptWeights original = random_opt_weights(s.c, uint64_t(100 + seed++));
    for (Dtype ck : {Dtype::kF32, Dtype::kF16, Dtype::kBF16}) {
      write_opt_checkpoint(dir.path(), original, ck);
      LoadedCheckpoint loaded = load_opt_checkpoint(dir.path());
      CHECK(loaded.config_file == dir.path() + "/config.json");
      CHECK(loaded.source_dtype == dtype_name(ck));
      // The loader's arrays are the originals rounded as the file stores them, bit for bit.
      const auto got = loaded.weights.tensors();
      const auto want = const_cast<const OptWeights&>(original).tensors();
      REQUIRE(got.size() == want.size());
      for (size_t t = 0; t < got.size(); ++t)
        for (size_t i = 0; i < want[t]->size(); ++i) {
          const float x = (*want[t])[i];
          const float r = ck == Dtype::kF32 ? x : ck == Dtype::kF16 ? round_fp16(x) : round_bf16(x);
          if ((*got[t])[i] != r) FAIL("tensor " << t << " element " << i << ": " << (*got[t])[i] << " != " << r);
        }
      for (cxlpool_kv_dtype_t kvt : {CXLPOOL_KV_FP32, CXLPOOL_KV_FP16, CXLPOOL_KV_BF16}) {
        DYNAMIC_SECTION("d=" << s.c.hidden << " checkpoint " << dtype_name(ck) << " kv dtype " << kvt) {
          const RefModel ref = reference_of(loaded.weights, kvt == CXLPOOL_KV_FP16   ? 1
                                                            : kvt == CXLPOOL_KV_BF16 ? 2
                                                                                     : 0);
          OptModel model(loaded.weights, 2);
          const auto g = model.kv_geometry(kvt, s.tokens_per_block);
          Arena arena(g, pool.pool, false);
          Seq seq(arena);
          KvStore kv(g);
          kv.add_sequence(seq.seq);
          std::mt19937 rng(uint32_t(seed * 31 + kvt));
          const auto prompt = random_prompt(rng, 11, s.c.vocab);  // crosses block boundaries
          // The engine: one batched prefill, every position's logits.
          const size_t reused = kv.append(prompt.data(), prompt.size());
          REQUIRE(reused == 0);
          std::vector<float> all;
          model.forward(kv, prompt.data(), prompt.size(), 0, true, &all);
          // The reference: token by token.
          RefCache cache{std::vector<std::vector<float>>(size_t(ref.layers)),
                         std::vector<std::vector<float>>(size_t(ref.layers))};
          std::vector<float> expect;
          for (size_t p = 0; p < prompt.size(); ++p) {
            expect = ref_step(ref, cache, prompt[p], int(p));
            require_close(
                std::vector<float>(all.begin() + long(p * s.c.vocab), all.begin() + long((p + 1) * s.c.vocab)), expect,
                2e-4, 2e-3, "prefill position " + std::to_string(p));
          }
          // Decode steps: the engine appends into the blocks; the reference follows its tokens.
          std::vector<float> logits(all.end() - long(s.c.vocab), all.end());
          for (int step = 0; step < 8; ++step) {
            const int32_t next = greedy(logits);
            logits = decode_step(model, kv, next);
            expect = ref_step(ref, cache, next, int(prompt.size()) + step);
            require_close(logits, expect, 2e-4, 2e-3, "decode step " + std::to_string(step));
          }
        }
      }
    }
  }
}

TEST_CASE("engine: a decode over an imported view equals one sequence, bit for bit", "[unit]") {
  Pool pool;
  const OptConfig c{32, 4, 2, 64, 97, 96};
  OptModel model(random_opt_weights(c, 7), 2);
  const auto g = model.kv_geometry(CXLPOOL_KV_FP16, 4);
  Arena arena(g, pool.pool, true);
  Arena own(g, pool.pool, false);  // the decode side's blocks for the tokens it generates
  std::mt19937 rng(5);
  for (size_t n : {1u, 3u, 4u, 5u, 8u, 13u, 16u, 17u, 30u}) {
    const auto prompt = random_prompt(rng, n, c.vocab);
    // One process: prefill and decode in one sequence.
    Seq one(arena);
    KvStore kv1(g);
    kv1.add_sequence(one.seq);
    PrefillStats st;
    auto logits = prefill(model, kv1, prompt, &st);
    const auto tokens1 = generate(model, kv1, logits, 10);
    // The handoff: export, import, the last token's logits from the blocks, own sequence after.
    cxlpool_kv_handle_t h{};
    REQUIRE(cxlpool_kv_seq_export(one.seq, n, &h) == CXLPOOL_OK);
    cxlpool_kv_view_t* view = nullptr;
    REQUIRE(cxlpool_kv_import(&pool.pool, 1, &g, &h, &view) == CXLPOOL_OK);
    {
      Seq mine(own);
      KvStore kv2(g);
      kv2.add_view(view);
      kv2.add_sequence(mine.seq);
      REQUIRE(kv2.tokens() == n);
      const auto first = logits_of_last(model, kv2, prompt.back());
      REQUIRE(first == logits);  // bit for bit
      const auto tokens2 = generate(model, kv2, first, 10);
      CHECK(tokens2 == tokens1);
      // The view is read only: the engine never writes into the exporter's blocks.
      REQUIRE_THROWS_AS(kv2.writable_row(0, 0, 0), cxlpool::engine::Error);
    }
    REQUIRE(cxlpool_kv_view_release(view) == CXLPOOL_OK);
  }
}

TEST_CASE("engine: prefix blocks from the cache are not computed and change nothing", "[unit]") {
  Pool pool;
  const OptConfig c{32, 4, 2, 64, 97, 128};
  OptModel model(random_opt_weights(c, 9), 1);
  const auto g = model.kv_geometry(CXLPOOL_KV_FP16, 8);
  Arena cached(g, pool.pool, true), fresh(g, pool.pool, false);
  std::mt19937 rng(11);
  const auto prefix = random_prompt(rng, 40, c.vocab);
  auto a = prefix, b = prefix;
  for (int i = 0; i < 9; ++i) a.push_back(int32_t(rng() % c.vocab)), b.push_back(int32_t(rng() % c.vocab));
  Seq first(cached);
  KvStore kv1(g);
  kv1.add_sequence(first.seq);
  PrefillStats s1, s2, s3;
  generate(model, kv1, prefill(model, kv1, a, &s1), 4);
  CHECK(s1.computed == a.size());
  Seq second(cached);
  KvStore kv2(g);
  kv2.add_sequence(second.seq);
  const auto t2 = generate(model, kv2, prefill(model, kv2, b, &s2), 12);
  CHECK(s2.reused == 40);  // five whole blocks of 8
  CHECK(s2.computed == b.size() - 40);
  Seq scratch(fresh);
  KvStore kv3(g);
  kv3.add_sequence(scratch.seq);
  const auto t3 = generate(model, kv3, prefill(model, kv3, b, &s3), 12);
  CHECK(s3.computed == b.size());
  CHECK(t2 == t3);
  // A prompt entirely in the cache: its last token is run again, nothing written.
  Seq third(cached);
  KvStore kv4(g);
  kv4.add_sequence(third.seq);
  const std::vector<int32_t> whole(prefix.begin(), prefix.end());
  PrefillStats s4;
  const auto l4 = prefill(model, kv4, whole, &s4);
  CHECK(s4.reused == 40);
  CHECK(s4.computed == 1);
  Seq fourth(fresh);
  KvStore kv5(g);
  kv5.add_sequence(fourth.seq);
  CHECK(prefill(model, kv5, whole, nullptr) == l4);
}

TEST_CASE("engine: bad input is refused with a message", "[unit]") {
  Pool pool;
  const OptConfig c{16, 2, 1, 32, 50, 8};
  OptModel model(random_opt_weights(c, 1), 1);
  const auto g = model.kv_geometry(CXLPOOL_KV_FP32, 4);
  Arena arena(g, pool.pool, false);
  Seq seq(arena);
  KvStore kv(g);
  kv.add_sequence(seq.seq);
  REQUIRE_THROWS_WITH(prefill(model, kv, {1, 2, 50}, nullptr), Catch::Contains("outside the vocabulary"));
  Seq seq2(arena);
  KvStore kv2(g);
  kv2.add_sequence(seq2.seq);
  REQUIRE_THROWS_WITH(prefill(model, kv2, std::vector<int32_t>(9, 1), nullptr),
                      Catch::Contains("beyond the model's 8"));
  REQUIRE_THROWS_WITH(prefill(model, kv2, {}, nullptr), Catch::Contains("empty prompt"));
  cxlpool_kv_geometry_t fp8 = g;
  fp8.dtype = CXLPOOL_KV_FP8;
  REQUIRE_THROWS_WITH(KvStore(fp8), Catch::Contains("not computed by the engine"));
  OptConfig bad = c;
  bad.heads = 3;
  REQUIRE_THROWS_WITH(random_opt_weights(bad, 1), Catch::Contains("multiple of num_attention_heads"));
}

TEST_CASE("engine: generic and AVX2 kernels agree", "[unit]") {
  const Kernels* fast = avx2_kernels();
  if (!fast) CXLPOOL_SKIP("this CPU has no AVX2+FMA+F16C: only the generic kernels run here");
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  for (size_t in : {1u, 7u, 8u, 37u, 768u}) {
    const size_t n = 5, out = 11;
    std::vector<float> x(n * in), w(out * in), b(out), y1(n * out), y2(n * out);
    for (auto* v : {&x, &w, &b})
      for (float& e : *v) e = u(rng);
    generic_kernels().linear_cols(x.data(), n, in, w.data(), b.data(), 0, out, out, y1.data());
    fast->linear_cols(x.data(), n, in, w.data(), b.data(), 0, out, out, y2.data());
    require_close(y2, y1, 1e-5 * double(in), 1e-5, "linear in=" + std::to_string(in));
    std::vector<float> row(in);
    std::vector<unsigned char> h1(in * 2), h2(in * 2);
    generic_kernels().store_row(x.data(), CXLPOOL_KV_FP16, in, h1.data());
    fast->store_row(x.data(), CXLPOOL_KV_FP16, in, h2.data());
    REQUIRE(h1 == h2);  // fp16 rounding is exact in both
    fast->load_row(h2.data(), CXLPOOL_KV_FP16, in, row.data());
    for (size_t i = 0; i < in; ++i) REQUIRE(row[i] == round_fp16(x[i]));
  }
}
