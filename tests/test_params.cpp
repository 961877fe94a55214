#include <gtest/gtest.h>

#include <fstream>

#include "core/suggest.hpp"
#include "policies/policy.hpp"
#include "policies/policy_config.hpp"
#include "tests/tiny_trace.hpp"

namespace kvsim::test {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(Size, CountsAndPercentages) {
  EXPECT_EQ(Size::parse("128").resolve(640), 128);
  EXPECT_EQ(Size::parse("20%").resolve(640), 128);  // exactly 128, no rounding noise
  EXPECT_EQ(Size::parse("20%").resolve(641), 129);  // ceil(128.2)
  EXPECT_EQ(Size::parse("12.5%").resolve(8), 1);
  EXPECT_THROW(Size::parse("1.5"), std::invalid_argument);
  EXPECT_THROW(Size::parse("120%"), std::invalid_argument);
  EXPECT_THROW(Size::parse("-3"), std::invalid_argument);
  EXPECT_THROW(Size::parse("abc"), std::invalid_argument);
}

TEST(Params, DefaultsAndOverrides) {
  const PolicyConfig c = make_policy_config("snapkv", {{"window", "8"}});
  EXPECT_EQ(c.params.get_int("window"), 8);
  EXPECT_EQ(c.params.get_int("kernel"), 7);
  EXPECT_EQ(c.params.get_string("pooling"), "max");
  EXPECT_EQ(c.params.get_string("budget"), "20%");
  EXPECT_EQ(c.params.str(),
            "budget=20%,budget_rounding=ceil,caches=kv_head,decode=grow,group_reduce=mean,kernel=7,"
            "merge=none,pooling=max,question=compress,window=8");
  EXPECT_EQ(c.needs().window_group_sums, std::vector<int>{8});  // the mean: the group's sums
}

TEST(Params, ErrorsNameThePolicyTheKeyAndTheRule) {
  const std::string unknown = error_of([] { make_policy_config("h2o", {{"windw", "3"}}); });
  EXPECT_NE(unknown.find("h2o: unknown parameter 'windw' (valid: budget, budget_rounding, merge, "
                         "recent, mode, normalize, caches, question)"),
            std::string::npos)
      << unknown;
  const std::string range = error_of([] { make_policy_config("snapkv", {{"window", "0"}}); });
  EXPECT_NE(range.find("snapkv: parameter 'window' = '0' is out of range"), std::string::npos)
      << range;
  const std::string choice = error_of([] { make_policy_config("snapkv", {{"pooling", "min"}}); });
  EXPECT_NE(choice.find("is not one of max|avg"), std::string::npos) << choice;
  const std::string type = error_of([] { make_policy_config("streamingllm", {{"sinks", "x"}}); });
  EXPECT_NE(type.find("'sinks' = 'x' is not an integer"), std::string::npos) << type;
  const std::string policy = error_of([] { make_policy_config("h3o", {}); });
  EXPECT_NE(policy.find("unknown policy 'h3o' (did you mean 'h2o'?) (known: "), std::string::npos)
      << policy;
}

TEST(Params, UnknownNamesSuggestTheNearest) {
  // One edit of a short name, a swap of neighbours, a dropped letter; nothing for another word.
  EXPECT_EQ(nearest_name("h2oo", {"h2o", "hae", "tova"}), "h2o");
  EXPECT_EQ(nearest_name("recnet", {"budget", "recent", "mode"}), "recent");
  EXPECT_EQ(nearest_name("--samples", {"--sample", "--out"}), "--sample");
  EXPECT_EQ(nearest_name("window", {"budget", "recent", "mode"}), "");
  EXPECT_EQ(nearest_name("ab", {"xy"}), "");
  // The nearest wins over an earlier, farther one; a tie goes to the first listed.
  EXPECT_EQ(nearest_name("snapkv:kvpres",
                         {"snapkv:original", "snapkv:kvcache-factory", "snapkv:kvpress"}),
            "snapkv:kvpress");
  EXPECT_EQ(nearest_name("tova1", {"tova2", "tova3"}), "tova2");
  EXPECT_EQ(did_you_mean("recnt", {"recent"}), " (did you mean 'recent'?)");
  EXPECT_EQ(did_you_mean("zzz", {"recent"}), "");
  const std::string param = error_of([] { make_policy_config("h2o", {{"recnt", "3"}}); });
  EXPECT_NE(param.find("h2o: unknown parameter 'recnt' (did you mean 'recent'?) (valid: "),
            std::string::npos)
      << param;
  const std::string preset = error_of([] { make_policy_config("snapkv:kvpres", {}); });
  EXPECT_NE(preset.find("unknown preset 'snapkv:kvpres' (did you mean 'snapkv:kvpress'?)"),
            std::string::npos)
      << preset;
}

TEST(Config, IniSectionsAndSetOverrides) {
  const std::string path = temp_path("policies.ini");
  std::ofstream(path) << "# comment\n[h2o]\nbudget = 64\nrecent = 25%\n\n[snapkv]\nwindow=16\n";
  PolicyOverrides o = read_policy_config(path);
  EXPECT_EQ(o["h2o"]["budget"], "64");
  EXPECT_EQ(o["h2o"]["recent"], "25%");
  EXPECT_EQ(o["snapkv"]["window"], "16");
  apply_set_option("h2o.budget=10%", o);
  EXPECT_EQ(o["h2o"]["budget"], "10%");
  EXPECT_THROW(apply_set_option("h2obudget=3", o), std::invalid_argument);
  EXPECT_THROW(apply_set_option("h2o.budget", o), std::invalid_argument);
  std::ofstream(path) << "budget = 3\n";
  EXPECT_NE(error_of([&] { read_policy_config(path); }).find("outside a [policy] section"),
            std::string::npos);
}

}  // namespace
}  // namespace kvsim::test

namespace kvsim::test {
namespace {

TEST(Size, CompressionRatioRoundsDownAsKvpress) {
  // kvpress: n_kept = int(k_len * (1 - compression_ratio)) in double arithmetic, so 0.8 of 640
  // keeps int(127.99999999999997) = 127, where 20% keeps ceil(128) = 128.
  EXPECT_EQ(Size::parse("compression_ratio:0.8").resolve(640), 127);
  EXPECT_EQ(Size::parse("20%").resolve(640), 128);
  EXPECT_EQ(Size::parse("compression_ratio:0.5").resolve(641), 320);
  EXPECT_EQ(Size::parse("compression_ratio:0").resolve(33), 33);
  EXPECT_EQ(Size::parse("compression_ratio:0.25").str(), "compression_ratio:0.25");
  EXPECT_THROW(Size::parse("compression_ratio:1"), std::invalid_argument);
  EXPECT_THROW(Size::parse("compression_ratio:-0.1"), std::invalid_argument);
  EXPECT_THROW(Size::parse("compression_ratio:"), std::invalid_argument);
}

TEST(Size, EachRepositorysRounding) {
  // Python's own results (CPython 3.11): int(0.29 * 100) = 28, round(100 * 0.29) = 29,
  // int(100 * (1 - (1 - 0.29))) = 29; int(0.29 * 640) = 185, round(640 * 0.29) = 186,
  // int(640 * (1 - 0.71)) = 185; int(255 * (1 - 0.8)) = 50; round(2.5) = 2, round(3.5) = 4.
  const Size p29 = Size::parse("29%"), p20 = Size::parse("20%"), half = Size::parse("50%");
  EXPECT_EQ(p29.resolve(100, Rounding::kFloor), 28);  // 28.999999999999996, truncated
  EXPECT_EQ(p29.resolve(100, Rounding::kCeil), 29);
  EXPECT_EQ(p29.resolve(100, Rounding::kRound), 29);
  EXPECT_EQ(p29.resolve(100, Rounding::kKvpress), 29);
  EXPECT_EQ(p29.resolve(640, Rounding::kFloor), 185);
  EXPECT_EQ(p29.resolve(640, Rounding::kRound), 186);
  EXPECT_EQ(p29.resolve(640, Rounding::kKvpress), 185);
  EXPECT_EQ(p20.resolve(255, Rounding::kKvpress), 50);
  EXPECT_EQ(p20.resolve(255, Rounding::kCeil), 51);
  EXPECT_EQ(p20.resolve(640, Rounding::kKvpress), 127);
  EXPECT_EQ(half.resolve(5, Rounding::kRound), 2);  // half to even
  EXPECT_EQ(half.resolve(7, Rounding::kRound), 4);
  EXPECT_EQ(half.resolve(5, Rounding::kCeil), 3);
  // Counts are counts, whatever the rounding.
  EXPECT_EQ(Size::parse("33").resolve(100, Rounding::kKvpress), 33);
  EXPECT_THROW(parse_rounding("up"), std::invalid_argument);
}

TEST(Params, RepositoryPresetsRoundTheirBudgetsAsTheirRepositories) {
  auto entries = [](const std::string& name, const std::string& budget, int P) {
    return budget_entries(make_policy_config(name, {{"budget", budget}}), P);
  };
  EXPECT_EQ(entries("snapkv", "20%", 640), 128);              // kvsim: ceil
  EXPECT_EQ(entries("snapkv:kvpress", "20%", 640), 127);      // compression_ratio 0.8
  EXPECT_EQ(entries("snapkv:kvcache-factory", "50%", 5), 2);  // round(2.5)
  EXPECT_EQ(entries("snapkv:original", "50%", 5), 3);         // its repository sizes in entries
  // H2O and LOOK-M: int(255 * 0.1) = 25 heavy + 25 recent, one fewer than ceil(51).
  for (const std::string name : {"h2o:paper", "lookm:released"}) {
    const PolicyConfig c = make_policy_config(name, {});
    const BudgetSplit split = resolve_budget_split(c.params, 255, name, c.info->recent_share);
    EXPECT_EQ(split.total, 50) << name;
    EXPECT_EQ(split.recent, 25) << name;
    EXPECT_EQ(budget_entries(c, 255), 50) << name;
  }
  const PolicyConfig absolute =
      make_policy_config("h2o", {{"budget_rounding", "parts"}, {"recent", "8"}});
  EXPECT_NE(error_of([&] {
              resolve_budget_split(absolute.params, 100, "h2o", absolute.info->recent_share);
            }).find("h2o: budget_rounding = parts needs 'recent' as a percentage"),
            std::string::npos);
  // The share is the policy's own: the budget alone cannot split.
  EXPECT_NE(error_of([&] {
              resolve_budget_split(make_policy_config("h2o:paper", {}).params, 100, "h2o");
            }).find("h2o: budget_rounding = parts needs a recent part"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              make_policy_config("snapkv", {{"budget_rounding", "parts"}});
            }).find("'budget_rounding' = 'parts' is not one of"),
            std::string::npos);
}

TEST(Params, TheBudgetKindIsReadFromTheRegistration) {
  // A budget that resolves to entries, a special value declared by the policy (hae's auto), and
  // none at all; the budget as given beside it.
  const PolicyConfig knorm = make_policy_config("knorm", {});
  EXPECT_EQ(knorm.budget_kind(), BudgetKind::kEntries);
  EXPECT_EQ(knorm.budget_text(), "20%");
  EXPECT_EQ(budget_entries(knorm, 640), 128);
  const PolicyConfig hae = make_policy_config("hae", {});
  EXPECT_EQ(hae.budget_kind(), BudgetKind::kSpecial);
  EXPECT_EQ(hae.budget_text(), "auto");
  EXPECT_EQ(budget_entries(hae, 640), -1);
  const PolicyConfig hae64 = make_policy_config("hae", {{"budget", "64"}});
  EXPECT_EQ(hae64.budget_kind(), BudgetKind::kEntries);
  EXPECT_EQ(budget_entries(hae64, 640), 64);
  for (const std::string name : {"fastv", "st3", "full"}) {
    const PolicyConfig c = make_policy_config(name, {});
    EXPECT_EQ(c.budget_kind(), BudgetKind::kSelfSized) << name;
    EXPECT_EQ(c.budget_text(), "") << name;
    EXPECT_EQ(budget_entries(c, 640), -1) << name;
  }
}

TEST(Params, CompressionRatioIsAnAliasOfTheBudget) {
  const PolicyConfig c = make_policy_config("snapkv:kvpress", {{"compression_ratio", "0.8"}});
  EXPECT_EQ(c.params.get_string("budget"), "compression_ratio:0.8");
  EXPECT_EQ(budget_entries(c, 640), 127);
  EXPECT_EQ(budget_entries(make_policy_config("hae", {}), 640), -1);  // "auto"
  EXPECT_EQ(budget_entries(make_policy_config("fastv", {}), 640), -1);
  std::string err = error_of([] {
    make_policy_config("h2o", {{"compression_ratio", "0.5"}, {"budget", "10"}});
  });
  EXPECT_NE(err.find("h2o: give 'budget' or 'compression_ratio', not both"), std::string::npos);
  err = error_of([] { make_policy_config("fastv", {{"compression_ratio", "0.5"}}); });
  EXPECT_NE(err.find("fastv: parameter 'compression_ratio' given, but fastv has no budget"),
            std::string::npos)
      << err;
  err = error_of([] { make_policy_config("h2o", {{"compression_ratio", "1.5"}}); });
  EXPECT_NE(err.find("not a compression ratio in [0, 1)"), std::string::npos) << err;
}

TEST(Presets, PinAReferenceReading) {
  const PolicyConfig c = make_policy_config("snapkv:kvpress", {});
  EXPECT_EQ(c.label, "snapkv:kvpress");
  EXPECT_EQ(c.info->name, "snapkv");
  EXPECT_EQ(c.params.str(),
            "budget=20%,budget_rounding=kvpress,caches=kv_head,decode=grow,group_reduce=mean,"
            "kernel=5,merge=none,pooling=avg,question=append,window=64");
  EXPECT_EQ(c.needs().window_group_sums, std::vector<int>{64});
  // User overrides apply on top of the preset.
  EXPECT_EQ(make_policy_config("snapkv:kvpress", {{"window", "16"}}).params.get_int("window"), 16);
  EXPECT_EQ(make_policy_config("pyramidkv:kvcache-factory", {}).params.get_string("rounding"),
            "reference");
  EXPECT_EQ(make_policy_config("h2o:kvcache-factory", {}).params.get_string("recent"), "8");
  const std::string err = error_of([] { make_policy_config("snapkv:nope", {}); });
  EXPECT_NE(err.find("unknown preset 'snapkv:nope' (known: snapkv:original"), std::string::npos)
      << err;
  // Every preset resolves against its policy's declarations.
  for (const auto& p : policy_presets()) EXPECT_NO_THROW(make_policy_config(p.name, {})) << p.name;
}

}  // namespace
}  // namespace kvsim::test

namespace kvsim::test {
namespace {

TEST(Config, SweepFile) {
  const std::string path = temp_path("sweep.ini");
  std::ofstream(path) << "[sweep]\ntrace = a.h5\ntrace = dir/*.h5\npolicy = hae\npolicy = h2o\n"
                         "budget = 20%\n[grid]\nhae.r = 0.001,0.002\nh2o.budget = 8:16:8\n"
                         "[set]\nhae.alpha = 0.0005\n";
  const SweepFile f = read_sweep_file(path);
  EXPECT_EQ(f.traces, (std::vector<std::string>{"a.h5", "dir/*.h5"}));
  EXPECT_EQ(f.policies, (std::vector<std::string>{"hae", "h2o"}));
  EXPECT_EQ(f.budget, "20%");
  EXPECT_EQ(f.grids, (std::vector<std::string>{"hae.r=0.001,0.002", "h2o.budget=8:16:8"}));
  EXPECT_EQ(f.sets, (std::vector<std::string>{"hae.alpha=0.0005"}));
  std::ofstream(path) << "[sweep]\nbogus = 1\n";
  EXPECT_NE(error_of([&] { read_sweep_file(path); }).find("unknown key 'sweep.bogus'"),
            std::string::npos);
}

}  // namespace
}  // namespace kvsim::test
