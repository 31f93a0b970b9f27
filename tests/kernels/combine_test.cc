// CombinePartials (epilogue.h): the split-K combine of docs/operator.md section 5.
#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "smla/kernels/epilogue.h"

namespace smla::kernels {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

struct Split {
  float m, l;
  std::vector<float> acc;
  SoftmaxPartial part() const { return {m, l, acc.data()}; }
};

Split Empty() { return {-kInf, 0.0f, std::vector<float>(512, 0.0f)}; }

// A split over given (score, value) keys, computed in double then stored as f32 (base 2).
Split Over(const std::vector<std::pair<double, double>>& keys) {
  Split s{-kInf, 0.0f, std::vector<float>(512, 0.0f)};
  double m = -std::numeric_limits<double>::infinity();
  for (auto [score, v] : keys) m = std::max(m, score * 1.4426950408889634);
  double l = 0;
  std::vector<double> acc(512, 0.0);
  for (auto [score, v] : keys) {
    const double p = std::exp2(score * 1.4426950408889634 - m);
    l += p;
    for (int i = 0; i < 512; ++i) acc[i] += p * v * (i % 2 ? -1 : 1);
  }
  s.m = static_cast<float>(m);
  s.l = static_cast<float>(l);
  for (int i = 0; i < 512; ++i) s.acc[i] = static_cast<float>(acc[i]);
  return s;
}

void ExpectPositiveZero(const std::vector<float>& out) {
  for (float v : out) {
    ASSERT_EQ(v, 0.0f);
    ASSERT_FALSE(std::signbit(v));
  }
}

TEST(CombineTest, NoSplitsNoSink) {
  std::vector<float> out(512, 7.0f);
  float lse = 1.0f;
  CombinePartials(nullptr, 0, false, 0.0f, out.data(), &lse);
  ExpectPositiveZero(out);
  EXPECT_TRUE(std::isinf(lse) && lse < 0);
}

TEST(CombineTest, AllSplitsEmptyWithAndWithoutSink) {
  std::vector<Split> s = {Empty(), Empty(), Empty()};
  std::vector<SoftmaxPartial> parts;
  for (auto& x : s) parts.push_back(x.part());
  std::vector<float> out(512, std::nanf(""));
  float lse = 0;
  CombinePartials(parts.data(), 3, false, 0.0f, out.data(), &lse);
  ExpectPositiveZero(out);
  EXPECT_TRUE(std::isinf(lse) && lse < 0);
  // Sink only: output +0, lse = sink (a zero sink is not "no sink").
  for (float sink : {0.0f, -3.5f, 2.25f, -80.0f}) {
    std::fill(out.begin(), out.end(), std::nanf(""));
    CombinePartials(parts.data(), 3, true, sink, out.data(), &lse);
    ExpectPositiveZero(out);
    EXPECT_NEAR(lse, sink, 1e-6f * std::max(1.0f, std::fabs(sink)));
  }
}

TEST(CombineTest, SplitsEqualTheWholeWithSink) {
  std::vector<std::pair<double, double>> keys;
  for (int j = 0; j < 40; ++j) keys.push_back({std::sin(j * 1.7) * 6.0, std::cos(j * 0.3)});
  for (bool has_sink : {false, true}) {
    const float sink = 1.25f;
    // Reference in double.
    double m = -std::numeric_limits<double>::infinity();
    for (auto [s, v] : keys) m = std::max(m, s);
    if (has_sink) m = std::max(m, double{sink});
    double z = has_sink ? std::exp(sink - m) : 0.0;
    double num = 0.0;
    for (auto [s, v] : keys) {
      z += std::exp(s - m);
      num += std::exp(s - m) * v;
    }
    const double want = num / z, want_lse = m + std::log(z);
    // One split, and the same keys over 5 splits with two of them empty.
    std::vector<Split> one = {Over(keys)};
    std::vector<Split> five = {Over({keys.begin(), keys.begin() + 10}), Empty(),
                               Over({keys.begin() + 10, keys.begin() + 11}), Empty(),
                               Over({keys.begin() + 11, keys.end()})};
    for (auto* splits : {&one, &five}) {
      std::vector<SoftmaxPartial> parts;
      for (auto& x : *splits) parts.push_back(x.part());
      std::vector<float> out(512);
      float lse;
      CombinePartials(parts.data(), static_cast<int>(parts.size()), has_sink, sink, out.data(),
                      &lse);
      for (int i = 0; i < 512; ++i) {
        ASSERT_NEAR(out[i], (i % 2 ? -1 : 1) * want, 1e-5) << "lane " << i;
      }
      EXPECT_NEAR(lse, want_lse, 1e-5 * std::max(1.0, std::fabs(want_lse)));
    }
  }
}

TEST(CombineTest, SinkFarAboveEveryKeyAndKeysFarAboveSink) {
  // A sink 200 nats above the keys: weights underflow to zero, output +0 (not NaN), lse = sink.
  std::vector<Split> s = {Over({{-100.0, 1.0}, {-120.0, 2.0}})};
  std::vector<SoftmaxPartial> parts = {s[0].part()};
  std::vector<float> out(512);
  float lse;
  CombinePartials(parts.data(), 1, true, 100.0f, out.data(), &lse);
  for (float v : out) ASSERT_FALSE(std::isnan(v));
  for (float v : out) ASSERT_EQ(v, 0.0f);
  EXPECT_NEAR(lse, 100.0f, 1e-4f);
  // Keys far above the sink: the sink vanishes, output is the plain softmax.
  CombinePartials(parts.data(), 1, true, -500.0f, out.data(), &lse);
  const double w = 1.0 / (1.0 + std::exp(-20.0));
  EXPECT_NEAR(out[0], w * 1.0 + (1 - w) * 2.0, 1e-5);
  EXPECT_NEAR(lse, -100.0 + std::log1p(std::exp(-20.0)), 1e-4);
}

TEST(CombineTest, NegativeZeroAccumulatorBecomesPositiveZero) {
  Split s{0.0f, 1.0f, std::vector<float>(512, -0.0f)};
  SoftmaxPartial p = s.part();
  std::vector<float> out(512);
  float lse;
  CombinePartials(&p, 1, false, 0.0f, out.data(), &lse);
  ExpectPositiveZero(out);
  EXPECT_EQ(lse, 0.0f);
}

}  // namespace
}  // namespace smla::kernels
