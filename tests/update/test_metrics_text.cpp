// Tests of cubridge/update/metrics_text.hpp: the Prometheus text format 0.0.4 as written (HELP
// and TYPE lines, samples, label escaping), every line read back against the exposition
// grammar, and the families of write_module_metrics() and write_process_health_metrics().
#include <cubridge/core/error.hpp>
#include <cubridge/update/metrics_text.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {

using cubridge::metric_type;
using cubridge::metrics_text_writer;
using cubridge::module_report;

// The exposition format's lines: a comment (HELP, TYPE) or a sample with optional labels.
const std::regex help_line(R"(# HELP [a-zA-Z_:][a-zA-Z0-9_:]* (?:[^\\\n]|\\\\|\\n)*)");
const std::regex type_line(R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge))");
const std::regex sample_line(
    R"(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\\\|\\"|\\n)*")"
    R"((?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\\\|\\"|\\n)*")*\})? (0|[1-9][0-9]*))");

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// Every line matches the grammar; every sample belongs to the family its TYPE line started, and
// no family is typed twice. Returns the families with their sample counts.
std::map<std::string, int> check_exposition(const std::string& text) {
  EXPECT_TRUE(text.empty() || text.back() == '\n') << "the last line ends in a line feed";
  std::map<std::string, int> families;
  std::string current;
  for (const auto& line : lines_of(text)) {
    std::smatch m;
    if (std::regex_match(line, help_line)) continue;
    if (std::regex_match(line, m, type_line)) {
      current = m[1];
      EXPECT_EQ(families.count(current), 0u) << "typed twice: " << line;
      families[current] = 0;
      continue;
    }
    if (std::regex_match(line, m, sample_line)) {
      EXPECT_EQ(m[1], current) << "a sample outside its family: " << line;
      ++families[current];
      continue;
    }
    ADD_FAILURE() << "not a line of the text format: '" << line << "'";
  }
  return families;
}

TEST(MetricsTextTest, WritesFamiliesWithHelpTypeAndSamples) {
  metrics_text_writer out;
  out.family("cubridge_up", "Whether it runs.", metric_type::gauge);
  out.sample(1);
  out.family("cubridge_requests_total", "Requests, by reason.", metric_type::counter);
  out.sample(3, {{"reason", "busy"}});
  out.sample(18446744073709551615u, {{"reason", "timeout"}, {"route", "put"}});
  EXPECT_EQ(out.text(),
            "# HELP cubridge_up Whether it runs.\n"
            "# TYPE cubridge_up gauge\n"
            "cubridge_up 1\n"
            "# HELP cubridge_requests_total Requests, by reason.\n"
            "# TYPE cubridge_requests_total counter\n"
            "cubridge_requests_total{reason=\"busy\"} 3\n"
            "cubridge_requests_total{reason=\"timeout\",route=\"put\"} 18446744073709551615\n");
  const auto families = check_exposition(out.text());
  EXPECT_EQ(families.at("cubridge_up"), 1);
  EXPECT_EQ(families.at("cubridge_requests_total"), 2);
}

TEST(MetricsTextTest, EscapesLabelValuesAndHelpAsTheFormatSays) {
  EXPECT_EQ(cubridge::escape_label_value(R"(a\b"c)"
                                         "\nd"),
            R"(a\\b\"c\nd)");
  EXPECT_EQ(cubridge::escape_help("back\\slash \"quoted\"\nnext"), R"(back\\slash "quoted"\nnext)");
  metrics_text_writer out;
  out.family("cubridge_module_version", "Help with \\ and\na line feed.", metric_type::gauge);
  out.sample(2, {{"module", "we\"ird\\name\nx"}});
  out.sample(0, {{"module", ""}});
  out.sample(5, {{"module", "utf-8 \xc3\xa9 and {braces}, commas"}});
  EXPECT_NE(out.text().find("# HELP cubridge_module_version Help with \\\\ and\\na line feed.\n"),
            std::string::npos)
      << out.text();
  EXPECT_NE(out.text().find("cubridge_module_version{module=\"we\\\"ird\\\\name\\nx\"} 2\n"),
            std::string::npos)
      << out.text();
  EXPECT_EQ(check_exposition(out.text()).at("cubridge_module_version"), 3);
}

TEST(MetricsTextTest, RefusesBadNamesRepeatedFamiliesAndSamplesOutsideOne) {
  EXPECT_TRUE(cubridge::is_metric_name("a:b_c9"));
  EXPECT_FALSE(cubridge::is_metric_name("9lives"));
  EXPECT_FALSE(cubridge::is_metric_name(""));
  EXPECT_FALSE(cubridge::is_metric_name("with-dash"));
  EXPECT_TRUE(cubridge::is_label_name("_module"));
  EXPECT_FALSE(cubridge::is_label_name("__reserved"));
  EXPECT_FALSE(cubridge::is_label_name("a:b"));
  metrics_text_writer out;
  EXPECT_THROW(out.sample(1), cubridge::error) << "no family yet";
  EXPECT_THROW(out.family("bad name", "x", metric_type::gauge), cubridge::error);
  out.family("cubridge_x", "x", metric_type::gauge);
  EXPECT_THROW(out.family("cubridge_x", "again", metric_type::counter), cubridge::error);
  EXPECT_THROW(out.sample(1, {{"bad-label", "v"}}), cubridge::error);
  EXPECT_THROW(out.sample(1, {{"a", "v"}, {"a", "w"}}), cubridge::error);
  EXPECT_EQ(out.text(), "# HELP cubridge_x x\n# TYPE cubridge_x gauge\n")
      << "a refused sample writes nothing";
}

TEST(MetricsTextTest, ModuleMetricsHaveAFixedSetOfLinesPerModule) {
  module_report plain{"plain", 3, {2, 3}, 1, "stage refused"};
  module_report hot{"hot\"one", 7, {7}, 0, {}};
  hot.counters =
      cubridge::module_counters{5, 1, 2, 4, 0, 900, 3, "CUDA_ERROR_INVALID_VALUE", false};
  metrics_text_writer out;
  cubridge::write_module_metrics(out, {plain, hot});
  const auto text = out.text();
  const auto families = check_exposition(text);
  const std::map<std::string, int> expected{
      {"cubridge_module_version", 2},         {"cubridge_module_versions_held", 2},
      {"cubridge_module_retired_waiting", 2}, {"cubridge_module_promotions_total", 1},
      {"cubridge_module_rollbacks_total", 1}, {"cubridge_module_rejected_total", 1},
      {"cubridge_module_unloaded_total", 1},  {"cubridge_module_reclaim_failures_total", 1},
      {"cubridge_module_launches_total", 1},  {"cubridge_module_launch_failures_total", 1},
  };
  EXPECT_EQ(families, expected) << text;
  for (const char* line :
       {"cubridge_module_version{module=\"plain\"} 3\n",
        "cubridge_module_versions_held{module=\"plain\"} 2\n",
        "cubridge_module_retired_waiting{module=\"plain\"} 1\n",
        "cubridge_module_version{module=\"hot\\\"one\"} 7\n",
        "cubridge_module_promotions_total{module=\"hot\\\"one\"} 5\n",
        "cubridge_module_rollbacks_total{module=\"hot\\\"one\"} 1\n",
        "cubridge_module_rejected_total{module=\"hot\\\"one\"} 2\n",
        "cubridge_module_unloaded_total{module=\"hot\\\"one\"} 4\n",
        "cubridge_module_launches_total{module=\"hot\\\"one\",version=\"7\"} 900\n",
        "cubridge_module_launch_failures_total{module=\"hot\\\"one\",version=\"7\"} 3\n"})
    EXPECT_NE(text.find(line), std::string::npos) << line << " in\n" << text;

  metrics_text_writer none;
  cubridge::write_module_metrics(none, {plain});
  EXPECT_EQ(check_exposition(none.text()).count("cubridge_module_promotions_total"), 0u)
      << "no counter families when no module has counters";
}

TEST(MetricsTextTest, TheProcessHealthGaugeFlipsAndSaysSinceWhen) {
  metrics_text_writer healthy;
  cubridge::write_process_health_metrics(healthy, false, std::nullopt);
  EXPECT_EQ(check_exposition(healthy.text()),
            (std::map<std::string, int>{{"cubridge_process_poisoned", 1}}));
  EXPECT_NE(healthy.text().find("\ncubridge_process_poisoned 0\n"), std::string::npos)
      << healthy.text();

  const auto since = std::chrono::system_clock::time_point(std::chrono::seconds(1796539294)) +
                     std::chrono::milliseconds(250);
  metrics_text_writer poisoned;
  cubridge::write_process_health_metrics(poisoned, true, since);
  EXPECT_EQ(check_exposition(poisoned.text()),
            (std::map<std::string, int>{{"cubridge_process_poisoned", 1},
                                        {"cubridge_process_poisoned_since_seconds", 1}}));
  EXPECT_NE(poisoned.text().find("\ncubridge_process_poisoned 1\n"), std::string::npos)
      << poisoned.text();
  EXPECT_NE(poisoned.text().find("\ncubridge_process_poisoned_since_seconds 1796539294\n"),
            std::string::npos)
      << poisoned.text();

  // Poisoned with no record (it could not be built): the gauge alone.
  metrics_text_writer bare;
  cubridge::write_process_health_metrics(bare, true, std::nullopt);
  EXPECT_EQ(check_exposition(bare.text()),
            (std::map<std::string, int>{{"cubridge_process_poisoned", 1}}));
}

}  // namespace
