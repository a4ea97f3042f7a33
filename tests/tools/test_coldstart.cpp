// `cubridge coldstart` without a GPU: aggregation, JSON, table and chart rendering, the NVRTC
// kernel, child processes (crash, hang, environment), the command line, and the whole parent run
// against a fake probe. The measurements themselves need the GPU machine (scripts/coldstart-gpu).
#include "coldstart/aggregate.hpp"
#include "coldstart/coldstart.hpp"
#include "coldstart/kernel_source.hpp"
#include "coldstart/phase_timings.hpp"
#include "coldstart/probe.hpp"
#include "coldstart/render_svg.hpp"
#include "coldstart/render_table.hpp"
#include "coldstart/spawn.hpp"

#include <cubridge/core/image.hpp>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include "temp_dir.hpp"

#include <dlfcn.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <span>
#include <sstream>
#include <string>
#include <vector>

namespace cs = cubridge::tool::coldstart;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

cs::run_result make_run(int run, cs::loading_mode mode, cs::scenario scen,
                        std::vector<cs::phase_time> phases) {
  cs::run_result r;
  r.run = run;
  r.loading = mode;
  r.scen = scen;
  r.ok = true;
  r.phases = std::move(phases);
  r.loading_reported = std::string(cs::env_value(mode));
  return r;
}

/// Three LAZY cubin runs, two EAGER cubin runs, LAZY ptx-cold with one failure, and an EAGER
/// ctx-create whose only run failed.
cs::report fixture() {
  using cs::loading_mode;
  using cs::scenario;
  cs::report rep;
  rep.machine = {"NVIDIA H200", 90, 13000, "580.159.04", "13.0", 130000, "gpu-host"};
  rep.runs_per_scenario = 3;
  rep.created = "2026-12-01T10:00:00Z";
  for (int run = 1; run <= 3; ++run) {
    const double d = run - 2;  // -1, 0, 1
    rep.runs.push_back(make_run(run, loading_mode::lazy, scenario::cubin,
                                {{"process_start", 20 + d},
                                 {"driver_load", 10 + d},
                                 {"cu_init", 100 + 2 * d},
                                 {"context", 120 + d},
                                 {"first_alloc", 1},
                                 {"module_load", 0.25},
                                 {"get_function", 0.05},
                                 {"first_launch", 0.5},
                                 {"second_launch", 0.01},
                                 {"cublas_create", 40}}));
    if (run <= 2)
      rep.runs.push_back(
          make_run(run, loading_mode::eager, scenario::cubin,
                   {{"cu_init", 100.0 + 10 * run}, {"context", 120}, {"cublas_create", 900}}));
  }
  rep.runs.push_back(make_run(1, loading_mode::lazy, scenario::ptx_cold,
                              {{"cu_init", 100}, {"module_load", 106}}));
  auto failed = make_run(2, loading_mode::lazy, scenario::ptx_cold, {{"cu_init", 99}});
  failed.ok = false;
  failed.failed_phase = "module_load";
  failed.error = "the probe process killed by signal 11 (Segmentation fault)";
  rep.runs.push_back(failed);
  auto all_failed = make_run(1, loading_mode::eager, scenario::ctx_create, {});
  all_failed.ok = false;
  all_failed.failed_phase = "context";
  all_failed.error = "cuCtxCreate CUDA_ERROR_OUT_OF_MEMORY <&>";
  rep.runs.push_back(all_failed);
  return rep;
}

// --- A small XML checker: enough to tell that the SVG is well formed, and to query it. ---------

struct xml_element {
  std::string name;
  std::map<std::string, std::string> attributes;
  std::vector<std::string> ancestors;  // outermost first
};

struct xml_document {
  bool ok = false;
  std::string error;
  std::vector<xml_element> elements;  // in document order
};

bool valid_entities(const std::string& text) {
  for (std::size_t i = text.find('&'); i != std::string::npos; i = text.find('&', i + 1)) {
    const auto end = text.find(';', i);
    if (end == std::string::npos) return false;
    const std::string entity = text.substr(i + 1, end - i - 1);
    if (entity != "amp" && entity != "lt" && entity != "gt" && entity != "quot" &&
        entity != "apos" && !(entity.size() > 1 && entity[0] == '#'))
      return false;
  }
  return true;
}

xml_document parse_xml(const std::string& text) {
  xml_document doc;
  std::vector<std::string> stack;
  std::size_t i = 0;
  bool root_seen = false;
  const auto fail = [&](std::string why) {
    doc.ok = false;
    doc.error = why + " at byte " + std::to_string(i);
    return doc;
  };
  const auto is_name_char = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == ':' ||
           c == '.';
  };
  if (text.starts_with("<?xml")) {
    i = text.find("?>");
    if (i == std::string::npos) return fail("unterminated prolog");
    i += 2;
  }
  while (i < text.size()) {
    if (text[i] != '<') {
      const auto next = text.find('<', i);
      const std::string chars =
          text.substr(i, next == std::string::npos ? std::string::npos : next - i);
      if (stack.empty() && chars.find_first_not_of(" \t\r\n") != std::string::npos)
        return fail("text outside the root element");
      if (chars.find('>') != std::string::npos) return fail("raw '>' in text");
      if (!valid_entities(chars)) return fail("bad entity in text");
      if (next == std::string::npos) break;
      i = next;
      continue;
    }
    if (text.compare(i, 4, "<!--") == 0) {
      i = text.find("-->", i);
      if (i == std::string::npos) return fail("unterminated comment");
      i += 3;
      continue;
    }
    if (text.compare(i, 2, "</") == 0) {
      std::size_t j = i + 2;
      while (j < text.size() && is_name_char(text[j])) ++j;
      const std::string name = text.substr(i + 2, j - i - 2);
      if (j >= text.size() || text[j] != '>') return fail("bad end tag");
      if (stack.empty() || stack.back() != name)
        return fail("end tag </" + name + "> does not match");
      stack.pop_back();
      i = j + 1;
      continue;
    }
    std::size_t j = i + 1;
    while (j < text.size() && is_name_char(text[j])) ++j;
    xml_element element;
    element.name = text.substr(i + 1, j - i - 1);
    if (element.name.empty()) return fail("empty tag name");
    if (stack.empty() && root_seen) return fail("second root element");
    for (;;) {
      while (j < text.size() && std::isspace(static_cast<unsigned char>(text[j]))) ++j;
      if (j >= text.size()) return fail("unterminated tag");
      if (text[j] == '>' || text.compare(j, 2, "/>") == 0) break;
      const std::size_t name_start = j;
      while (j < text.size() && is_name_char(text[j])) ++j;
      const std::string attribute = text.substr(name_start, j - name_start);
      if (attribute.empty() || j + 1 >= text.size() || text[j] != '=' || text[j + 1] != '"')
        return fail("bad attribute in <" + element.name + ">");
      const auto close = text.find('"', j + 2);
      if (close == std::string::npos) return fail("unterminated attribute");
      const std::string value = text.substr(j + 2, close - j - 2);
      if (value.find('<') != std::string::npos || !valid_entities(value))
        return fail("bad attribute value");
      if (!element.attributes.emplace(attribute, value).second) return fail("duplicate attribute");
      j = close + 1;
    }
    element.ancestors = stack;
    root_seen = true;
    doc.elements.push_back(element);
    if (text[j] == '>') {
      stack.push_back(element.name);
      i = j + 1;
    } else {
      i = j + 2;
    }
  }
  if (!stack.empty()) return fail("unclosed <" + stack.back() + ">");
  if (!root_seen) return fail("no root element");
  doc.ok = true;
  return doc;
}

// --- Running the built tool
// -----------------------------------------------------------------------

cs::child_outcome run_tool(std::vector<std::string> args,
                           std::vector<std::string> env_overrides = {},
                           std::vector<std::string> env_removed = {}) {
  return cs::run_child({CUBRIDGE_TOOL_PATH, std::move(args),
                        cs::environment_with(env_overrides, env_removed), 120s});
}

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

bool driver_present() {
  void* lib = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (lib) ::dlclose(lib);
  return lib != nullptr;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_executable(const fs::path& p, const std::string& text) {
  std::ofstream(p) << text;
  fs::permissions(p, fs::perms::owner_all);
}

/// A stand-in for `cubridge coldstart-probe`: answers --info, checks what the parent gives a
/// child (the kernel files, CUDA_MODULE_LOADING, the JIT cache directory, no CUDA_CACHE_DISABLE),
/// and reports fixed phases. FAKE_CRASH / FAKE_HANG name a scenario that crashes in module_load
/// or hangs in cu_init.
constexpr const char* fake_probe = R"SH(#!/bin/sh
case " $* " in
  *" --info "*) echo '{"ok":true,"machine":{"gpu":"Fake GPU","compute_capability":90,"driver_version":13000,"driver_release":"580.0"}}'; exit 0;;
esac
while [ $# -gt 0 ]; do
  case "$1" in
    --scenario) scen=$2; shift;; --loading) load=$2; shift;;
    --cubin) cubin=$2; shift;; --ptx) ptx=$2; shift;; --spawned-at) spawned=$2; shift;;
  esac
  shift
done
fail() { echo "{\"ok\":false,\"scenario\":\"$scen\",\"loading\":\"$load\",\"failed_phase\":\"check\",\"error\":\"$1\",\"phases\":[]}"; exit 1; }
[ -n "$CUDA_CACHE_DISABLE" ] && fail "CUDA_CACHE_DISABLE is set"
[ -d "$CUDA_CACHE_PATH" ] || fail "no JIT cache directory"
head -c 4 "$cubin" | grep -q ELF || fail "cubin is not an ELF"
grep -q "coldstart_fill" "$ptx" || fail "PTX lacks the kernel"
[ -n "$spawned" ] || fail "no --spawned-at"
echo "phase driver_load"
echo "phase cu_init"
[ "$FAKE_HANG" = "$scen" ] && exec sleep 60
echo "phase context"
echo "phase module_load"
[ "$FAKE_CRASH" = "$scen" ] && kill -SEGV $$
module=5
case "$scen" in
  ptx-cold) module=100; touch "$CUDA_CACHE_PATH/filled";;
  ptx-warm) if [ -f "$CUDA_CACHE_PATH/filled" ]; then module=1; else module=999; fi;;
  *) [ -z "$(ls -A "$CUDA_CACHE_PATH")" ] || fail "JIT cache of $scen is not empty";;
esac
echo "{\"ok\":true,\"scenario\":\"$scen\",\"loading\":\"$load\",\"loading_reported\":\"$CUDA_MODULE_LOADING\",\"phases\":[{\"phase\":\"cu_init\",\"ms\":100},{\"phase\":\"context\",\"ms\":120},{\"phase\":\"module_load\",\"ms\":$module}]}"
echo "phase exit"
)SH";

}  // namespace

// --- aggregation -------------------------------------------------------------------------------

TEST(coldstart_aggregate, median_of_odd_count_is_the_middle_value) {
  const auto s = cs::summarize({5, 1, 3});
  EXPECT_EQ(s.median, 3);
  EXPECT_EQ(s.min, 1);
  EXPECT_EQ(s.max, 5);
  EXPECT_EQ(s.count, 3u);
}

TEST(coldstart_aggregate, median_of_even_count_is_the_mean_of_the_middle_two) {
  const auto s = cs::summarize({4, 1, 10, 2});
  EXPECT_DOUBLE_EQ(s.median, 3.0);
  EXPECT_EQ(s.min, 1);
  EXPECT_EQ(s.max, 10);
  EXPECT_DOUBLE_EQ(cs::summarize({7}).median, 7);
  EXPECT_DOUBLE_EQ(cs::summarize({7, 8}).median, 7.5);
}

TEST(coldstart_aggregate, no_values_is_an_error) {
  EXPECT_THROW((void)cs::summarize({}), std::invalid_argument);
}

TEST(coldstart_aggregate, groups_by_loading_then_scenario_and_counts_failures) {
  const auto summary = cs::aggregate(fixture().runs);
  ASSERT_EQ(summary.size(), 4u);
  // LAZY first, then scenarios in catalogue order.
  EXPECT_EQ(summary[0].loading, cs::loading_mode::lazy);
  EXPECT_EQ(summary[0].scen, cs::scenario::cubin);
  EXPECT_EQ(summary[1].scen, cs::scenario::ptx_cold);
  EXPECT_EQ(summary[2].loading, cs::loading_mode::eager);
  EXPECT_EQ(summary[2].scen, cs::scenario::cubin);
  EXPECT_EQ(summary[3].scen, cs::scenario::ctx_create);

  const auto& lazy = summary[0];
  EXPECT_EQ(lazy.runs_ok, 3);
  EXPECT_EQ(lazy.runs_failed, 0);
  ASSERT_EQ(lazy.phases.size(), 10u);
  EXPECT_EQ(lazy.phases[0].phase, "process_start");
  EXPECT_EQ(lazy.phases[2].phase, "cu_init");
  EXPECT_DOUBLE_EQ(lazy.phases[2].ms.median, 100);
  EXPECT_DOUBLE_EQ(lazy.phases[2].ms.min, 98);
  EXPECT_DOUBLE_EQ(lazy.phases[2].ms.max, 102);
  EXPECT_DOUBLE_EQ(lazy.total.median, 291.81);  // each run's sum, then the median
  EXPECT_NEAR(lazy.total.min, 291.81 - 5, 1e-9);
  EXPECT_NEAR(lazy.stacked_median_ms(), 291.81, 1e-9);

  const auto& eager = summary[2];
  EXPECT_DOUBLE_EQ(eager.phases[0].ms.median, 115);  // cu_init 110, 120: even count
  EXPECT_DOUBLE_EQ(eager.total.median, 1135);

  const auto& ptx = summary[1];
  EXPECT_EQ(ptx.runs_ok, 1);
  EXPECT_EQ(ptx.runs_failed, 1);
  ASSERT_EQ(ptx.failures.size(), 1u);
  EXPECT_EQ(ptx.failures[0],
            "run 2: module_load: the probe process killed by signal 11 (Segmentation fault)");
  EXPECT_DOUBLE_EQ(ptx.phases[0].ms.median, 100);  // the failed run's cu_init is not counted

  EXPECT_EQ(summary[3].runs_ok, 0);
  EXPECT_TRUE(summary[3].phases.empty());
}

// --- JSON ------------------------------------------------------------------------------------

TEST(coldstart_json, run_result_round_trips) {
  const auto rep = fixture();
  for (const auto& r : rep.runs) {
    const nlohmann::json j = r;
    EXPECT_EQ(j.get<cs::run_result>(), r) << j.dump();
  }
}

TEST(coldstart_json, document_round_trips_and_carries_the_summary) {
  const auto rep = fixture();
  const auto doc = cs::document(rep);
  const auto text = doc.dump(2);
  const auto back = nlohmann::json::parse(text);
  EXPECT_EQ(back.get<cs::report>(), rep);
  EXPECT_EQ(back["tool"], "cubridge coldstart");
  EXPECT_EQ(back["machine"]["gpu"], "NVIDIA H200");
  EXPECT_EQ(back["machine"]["driver_release"], "580.159.04");
  ASSERT_EQ(back["runs"].size(), rep.runs.size());
  EXPECT_EQ(back["runs"][0]["phases"][2]["phase"], "cu_init");
  EXPECT_DOUBLE_EQ(back["runs"][0]["phases"][2]["ms"].get<double>(), 98);
  ASSERT_EQ(back["summary"].size(), 4u);
  EXPECT_EQ(back["summary"][0]["loading"], "lazy");
  EXPECT_EQ(back["summary"][0]["scenario"], "cubin");
  EXPECT_DOUBLE_EQ(back["summary"][0]["total_ms"]["median"].get<double>(), 291.81);
  EXPECT_EQ(back["summary"][0]["phases_ms"][2]["phase"], "cu_init");
  EXPECT_DOUBLE_EQ(back["summary"][0]["phases_ms"][2]["max"].get<double>(), 102);
  EXPECT_EQ(back["summary"][1]["runs_failed"], 1);
  EXPECT_FALSE(back["summary"][3].contains("total_ms"));
}

TEST(coldstart_json, unknown_scenario_or_mode_is_refused) {
  nlohmann::json j = make_run(1, cs::loading_mode::lazy, cs::scenario::cubin, {});
  j["scenario"] = "warp-drive";
  EXPECT_THROW((void)j.get<cs::run_result>(), std::invalid_argument);
  j["scenario"] = "cubin";
  j["loading"] = "sometimes";
  EXPECT_THROW((void)j.get<cs::run_result>(), std::invalid_argument);
}

TEST(coldstart_json, catalogue_keys_parse_back) {
  for (const auto& s : cs::scenarios()) EXPECT_EQ(cs::parse_scenario(s.key), s.id);
  EXPECT_EQ(cs::parse_loading("EAGER"), cs::loading_mode::eager);
  EXPECT_EQ(cs::parse_loading("Lazy"), cs::loading_mode::lazy);
  EXPECT_FALSE(cs::parse_loading("both"));
  for (const auto& p : cs::phases()) {
    EXPECT_EQ(cs::find_phase(p.key), &p);
    EXPECT_EQ(p.colour.size(), 7u);
  }
  EXPECT_EQ(cs::phase_label("context", cs::scenario::ctx_create), "first context: cuCtxCreate");
  EXPECT_EQ(cs::phase_label("module_load", cs::scenario::ptx_warm),
            "cuModuleLoadData: PTX, JIT cache warm");
}

// --- table --------------------------------------------------------------------------------------

TEST(coldstart_table, renders_the_fixture) {
  const auto rep = fixture();
  const auto table = cs::render_table(rep, cs::aggregate(rep.runs));
  for (const char* line : {
           "cubridge coldstart: NVIDIA H200 (sm_90), driver 580.159.04 (CUDA 13.0)\n",
           "3 runs per scenario, each in a fresh process",
           // Overview: one row per scenario with the totals and the runs that succeeded.
           "LAZY   cubin, primary context         291.810   286.810   296.810    3/3\n",
           "EAGER  cubin, cuCtxCreate context           -         -         -    0/1\n",
           // Details: median, min, max per phase with the exact call in the label.
           "  cuInit                                        100.000    98.000   102.000\n",
           "  first context: cuDevicePrimaryCtxRetain       120.000   119.000   121.000\n",
           "  second launch + sync                            0.010     0.010     0.010\n",
           "  cuModuleLoadData: PTX, JIT cache cold         106.000   106.000   106.000\n",
           "  FAILED run 2: module_load: the probe process killed by signal 11",
           "  FAILED run 1: context: cuCtxCreate CUDA_ERROR_OUT_OF_MEMORY",
       })
    EXPECT_NE(table.find(line), std::string::npos) << "missing: " << line << "\n" << table;
}

TEST(coldstart_table, describes_partly_known_machines) {
  EXPECT_EQ(cs::describe_machine({}), "unknown GPU");
  cs::machine_info m;
  m.gpu = "X";
  m.driver_version = 12080;
  EXPECT_EQ(cs::describe_machine(m), "X, driver (CUDA 12.8)");
}

// --- chart --------------------------------------------------------------------------------------

TEST(coldstart_svg, nice_axis_is_round_and_covers_the_longest_bar) {
  const auto a = cs::nice_axis(291.81);
  EXPECT_DOUBLE_EQ(a.step_ms, 50);
  EXPECT_DOUBLE_EQ(a.max_ms, 300);
  const auto b = cs::nice_axis(1135);
  EXPECT_DOUBLE_EQ(b.step_ms, 200);
  EXPECT_DOUBLE_EQ(b.max_ms, 1200);
  const auto c = cs::nice_axis(0.03);
  EXPECT_GE(c.max_ms, 0.03);
  EXPECT_LE(c.max_ms / c.step_ms, 8.01);
  EXPECT_DOUBLE_EQ(cs::nice_axis(0).max_ms, 1);
  for (double v : {1.0, 7.0, 99.0, 100.0, 101.0, 4321.0}) {
    const auto x = cs::nice_axis(v);
    EXPECT_GE(x.max_ms, v);
    EXPECT_LT(x.max_ms, v + x.step_ms + 1e-9);
  }
}

TEST(coldstart_svg, escapes_xml) {
  EXPECT_EQ(cs::xml_escape("a<b>&\"c'\x01"), "a&lt;b&gt;&amp;&quot;c&apos; ");
}

TEST(coldstart_svg, is_well_formed_with_a_bar_per_scenario_and_a_legend_entry_per_phase) {
  const auto rep = fixture();
  const auto summary = cs::aggregate(rep.runs);
  const auto svg = cs::render_svg(rep, summary);
  const auto doc = parse_xml(svg);
  ASSERT_TRUE(doc.ok) << doc.error << "\n" << svg;
  ASSERT_FALSE(doc.elements.empty());
  EXPECT_EQ(doc.elements[0].name, "svg");
  EXPECT_EQ(doc.elements[0].attributes.at("xmlns"), "http://www.w3.org/2000/svg");

  std::vector<std::string> bars;
  std::vector<std::string> legend;
  for (const auto& e : doc.elements) {
    if (e.name == "g" && e.attributes.count("class") && e.attributes.at("class") == "bar")
      bars.push_back(e.attributes.at("data-scenario"));
    if (e.name == "g" && e.attributes.count("class") && e.attributes.at("class") == "legend-item")
      legend.push_back(e.attributes.at("data-phase"));
  }
  EXPECT_EQ(bars, (std::vector<std::string>{"lazy/cubin", "lazy/ptx-cold", "eager/cubin",
                                            "eager/ctx-create"}));
  // Every phase that some scenario has, once, in the order paid.
  EXPECT_EQ(legend, (std::vector<std::string>{"process_start", "driver_load", "cu_init", "context",
                                              "first_alloc", "module_load", "get_function",
                                              "first_launch", "second_launch", "cublas_create"}));
  EXPECT_NE(svg.find("LAZY loading"), std::string::npos);
  EXPECT_NE(svg.find("EAGER loading"), std::string::npos);
  EXPECT_NE(svg.find("all 1 runs failed"), std::string::npos);
  EXPECT_NE(svg.find("CUDA_ERROR_OUT_OF_MEMORY &lt;&amp;&gt;"), std::string::npos);
  EXPECT_NE(svg.find(">(1 of 2 failed)</tspan>"), std::string::npos);
}

TEST(coldstart_svg, segment_widths_are_proportional_to_the_medians_and_stacked) {
  const auto rep = fixture();
  const auto summary = cs::aggregate(rep.runs);
  const cs::svg_layout layout;
  const auto doc = parse_xml(cs::render_svg(rep, summary, layout));
  ASSERT_TRUE(doc.ok) << doc.error;
  const double px_per_ms = layout.plot_width / cs::nice_axis(1135).max_ms;  // longest bar: EAGER
  std::map<std::string, double> next_x;  // per bar: where its next segment must start
  std::map<std::string, double> widths;  // "scenario/phase" -> width
  int segments = 0;
  for (const auto& e : doc.elements) {
    if (e.name != "rect" || !e.attributes.count("class") || e.attributes.at("class") != "segment")
      continue;
    ++segments;
    const double width = std::stod(e.attributes.at("width"));
    const double x = std::stod(e.attributes.at("x"));
    const double ms = std::stod(e.attributes.at("data-ms"));
    EXPECT_NEAR(width, ms * px_per_ms, 1e-3) << e.attributes.at("data-phase");
    // The enclosing <g class="bar">: the element before this one in document order at depth 1.
    std::string bar;
    for (const auto& other : doc.elements)
      if (&other < &e && other.name == "g" && other.attributes.count("data-scenario"))
        bar = other.attributes.at("data-scenario");
    if (!next_x.count(bar)) next_x[bar] = layout.plot_x;
    EXPECT_NEAR(x, next_x[bar], 2e-3) << bar << " " << e.attributes.at("data-phase");
    next_x[bar] = x + width;
    widths[bar + "/" + e.attributes.at("data-phase")] = width;
  }
  EXPECT_EQ(segments, 10 + 2 + 3);  // LAZY cubin, LAZY ptx-cold, EAGER cubin; none for all-failed
  // cublasCreate under EAGER (900 ms) is 22.5 times cublasCreate under LAZY (40 ms).
  EXPECT_NEAR(widths.at("eager/cubin/cublas_create") / widths.at("lazy/cubin/cublas_create"), 22.5,
              1e-4);
  EXPECT_NEAR(next_x.at("eager/cubin") - layout.plot_x, 1135 * px_per_ms, 1e-2);
}

TEST(coldstart_svg, renders_an_empty_report) {
  const auto doc = parse_xml(cs::render_svg({}, {}));
  EXPECT_TRUE(doc.ok) << doc.error;
}

// --- the kernel, compiled by NVRTC (no GPU needed)
// ------------------------------------------------

TEST(coldstart_kernel, nvrtc_compiles_it_to_a_cubin_for_the_exact_arch) {
  const auto cubin = cs::compile_kernel("sm_90");
  const auto info = cubridge::inspect_image(std::as_bytes(std::span(cubin)));
  EXPECT_EQ(info.kind, cubridge::image_kind::cubin);
  ASSERT_EQ(info.targets.size(), 1u);
  EXPECT_EQ(info.targets[0].arch_name, "sm_90");
  const auto* k = info.find_kernel(cs::kernel_name);
  ASSERT_NE(k, nullptr);
  ASSERT_TRUE(k->parameter_sizes.has_value());
  EXPECT_EQ(*k->parameter_sizes, (std::vector<std::size_t>{8, 4, 4}));  // float*, float, int
}

TEST(coldstart_kernel, nvrtc_compiles_it_to_nul_terminated_ptx) {
  const auto ptx = cs::compile_kernel("compute_90");
  ASSERT_FALSE(ptx.empty());
  EXPECT_EQ(ptx.back(), '\0');
  const auto info = cubridge::inspect_image(std::as_bytes(std::span(ptx)));
  EXPECT_EQ(info.kind, cubridge::image_kind::ptx);
  EXPECT_EQ(info.targets.at(0).arch_name, "compute_90");
  EXPECT_NE(info.find_kernel(cs::kernel_name), nullptr);
  EXPECT_FALSE(cs::nvrtc_version().empty());
}

TEST(coldstart_kernel, an_unknown_arch_fails_with_nvrtcs_message) {
  try {
    (void)cs::compile_kernel("sm_1");
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("nvrtcCompileProgram"), std::string::npos) << e.what();
  }
}

// --- child processes
// ------------------------------------------------------------------------------

TEST(coldstart_spawn, reads_lines_as_they_come_and_the_exit_status) {
  std::vector<std::string> seen;
  const auto out = cs::run_child({"/bin/sh",
                                  {"-c", "echo one; echo two >&2; printf 'three\\nfour'; exit 3"},
                                  cs::environment_with({}),
                                  10s},
                                 [&](const std::string& line) { seen.push_back(line); });
  EXPECT_EQ(out.how, cs::child_outcome::end::exited);
  EXPECT_EQ(out.exit_code, 3);
  EXPECT_EQ(out.stdout_lines, (std::vector<std::string>{"one", "three", "four"}));
  EXPECT_EQ(seen, out.stdout_lines);
  EXPECT_EQ(out.stderr_tail, "two\n");
  EXPECT_EQ(out.describe(), "exited with status 3");
}

TEST(coldstart_spawn, a_crash_is_reported_with_its_signal) {
  const auto out = cs::run_child(
      {"/bin/sh", {"-c", "echo phase module_load; kill -SEGV $$"}, cs::environment_with({}), 10s});
  EXPECT_EQ(out.how, cs::child_outcome::end::signaled);
  EXPECT_EQ(out.signal, SIGSEGV);
  EXPECT_NE(out.describe().find("killed by signal 11"), std::string::npos) << out.describe();
  EXPECT_EQ(out.stdout_lines, (std::vector<std::string>{"phase module_load"}));
}

TEST(coldstart_spawn, a_hang_is_killed_at_the_deadline) {
  const auto start = std::chrono::steady_clock::now();
  const auto out = cs::run_child(
      {"/bin/sh", {"-c", "echo phase cu_init; exec sleep 30"}, cs::environment_with({}), 300ms});
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(out.how, cs::child_outcome::end::timed_out);
  EXPECT_LT(took, 5s);
  EXPECT_GE(out.wall_ms, 300);
  EXPECT_EQ(out.stdout_lines, (std::vector<std::string>{"phase cu_init"}));
  EXPECT_NE(out.describe().find("timed out after"), std::string::npos);
}

TEST(coldstart_spawn, a_child_that_closes_its_output_but_lingers_is_killed_too) {
  const auto out = cs::run_child(
      {"/bin/sh", {"-c", "exec >/dev/null 2>&1; exec sleep 30"}, cs::environment_with({}), 300ms});
  EXPECT_EQ(out.how, cs::child_outcome::end::timed_out);
}

TEST(coldstart_spawn, a_missing_program_is_reported) {
  const auto out = cs::run_child({"/nonexistent/probe", {}, cs::environment_with({}), 10s});
  EXPECT_EQ(out.how, cs::child_outcome::end::spawn_failed);
  EXPECT_NE(out.describe().find("/nonexistent/probe"), std::string::npos) << out.describe();
}

TEST(coldstart_spawn, the_child_gets_the_environment_asked_for) {
  ::setenv("COLDSTART_TEST_REMOVED", "still here", 1);
  ::setenv("COLDSTART_TEST_KEPT", "kept", 1);
  const auto env = cs::environment_with({"COLDSTART_TEST_SET=LAZY", "COLDSTART_TEST_KEPT=replaced"},
                                        {"COLDSTART_TEST_REMOVED"});
  const auto out = cs::run_child(
      {"/bin/sh",
       {"-c", "echo \"$COLDSTART_TEST_SET|${COLDSTART_TEST_REMOVED-unset}|$COLDSTART_TEST_KEPT\""},
       env,
       10s});
  EXPECT_EQ(out.stdout_lines, (std::vector<std::string>{"LAZY|unset|replaced"}));
  EXPECT_EQ(
      std::count_if(env.begin(), env.end(),
                    [](const std::string& e) { return e.starts_with("COLDSTART_TEST_KEPT="); }),
      1);
  ::unsetenv("COLDSTART_TEST_REMOVED");
  ::unsetenv("COLDSTART_TEST_KEPT");
}

// --- what a child's outcome means
// -----------------------------------------------------------------

TEST(coldstart_interpret, a_report_and_a_clean_exit_is_a_measurement) {
  cs::child_outcome o;
  o.how = cs::child_outcome::end::exited;
  o.exit_code = 0;
  o.stdout_lines = {
      "phase cu_init",
      R"({"ok":true,"scenario":"nvrtc","loading":"eager","phases":[{"phase":"cu_init","ms":99.5}]})",
      "phase exit"};
  const auto r = cs::interpret_child(o, cs::loading_mode::eager, cs::scenario::nvrtc, 4);
  EXPECT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.run, 4);
  EXPECT_EQ(r.phases, (std::vector<cs::phase_time>{{"cu_init", 99.5}}));
}

TEST(coldstart_interpret, a_crash_names_the_phase_it_happened_in) {
  cs::child_outcome o;
  o.how = cs::child_outcome::end::signaled;
  o.signal = SIGSEGV;
  o.stdout_lines = {"phase driver_load", "phase cu_init", "phase module_load"};
  o.stderr_tail = "some\nnoise\nfrom the driver\n";
  const auto r = cs::interpret_child(o, cs::loading_mode::lazy, cs::scenario::ptx_cold, 2);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.failed_phase, "module_load");
  EXPECT_EQ(r.scen, cs::scenario::ptx_cold);
  EXPECT_NE(r.error.find("killed by signal 11"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("from the driver"), std::string::npos) << r.error;
}

TEST(coldstart_interpret, a_hang_names_the_phase_it_hung_in) {
  cs::child_outcome o;
  o.how = cs::child_outcome::end::timed_out;
  o.signal = SIGKILL;
  o.wall_ms = 60000;
  o.stdout_lines = {"phase context"};
  const auto r = cs::interpret_child(o, cs::loading_mode::lazy, cs::scenario::cubin, 1);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.failed_phase, "context");
  EXPECT_NE(r.error.find("timed out after 60.0 s"), std::string::npos) << r.error;
}

TEST(coldstart_interpret, the_probes_own_failure_is_kept) {
  cs::child_outcome o;
  o.how = cs::child_outcome::end::exited;
  o.exit_code = 1;
  o.stdout_lines = {
      "phase module_load",
      R"({"ok":false,"scenario":"ptx-cold","loading":"lazy","phases":[{"phase":"cu_init","ms":1}],"failed_phase":"module_load","error":"cuModuleLoadDataEx CUDA_ERROR_INVALID_PTX"})",
      "phase exit"};
  const auto r = cs::interpret_child(o, cs::loading_mode::lazy, cs::scenario::ptx_cold, 1);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.failed_phase, "module_load");
  EXPECT_EQ(r.error, "cuModuleLoadDataEx CUDA_ERROR_INVALID_PTX");
  EXPECT_EQ(r.phases.size(), 1u);
}

TEST(coldstart_interpret, a_crash_after_reporting_is_a_failure_in_exit) {
  cs::child_outcome o;
  o.how = cs::child_outcome::end::signaled;
  o.signal = SIGABRT;
  o.stdout_lines = {R"({"ok":true,"scenario":"cubin","loading":"lazy","phases":[]})", "phase exit"};
  const auto r = cs::interpret_child(o, cs::loading_mode::lazy, cs::scenario::cubin, 1);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.failed_phase, "exit");
  EXPECT_NE(r.error.find("after reporting its measurements"), std::string::npos) << r.error;
}

TEST(coldstart_interpret, garbage_output_is_a_failure_not_a_crash_of_the_parent) {
  cs::child_outcome o;
  o.how = cs::child_outcome::end::exited;
  o.exit_code = 0;
  o.stdout_lines = {"{not json", R"({"ok":true,"scenario":"bogus","loading":"lazy"})"};
  const auto r = cs::interpret_child(o, cs::loading_mode::lazy, cs::scenario::cubin, 1);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.failed_phase, "start");
}

// --- command line
// ---------------------------------------------------------------------------------

namespace {
/// Parses `args` (after the program name) with the coldstart command registered.
void parse(std::vector<std::string> args, cs::options* parsed = nullptr) {
  CLI::App app;
  cs::command command(app);
  std::reverse(args.begin(), args.end());  // CLI11 takes a reversed vector
  app.parse(args);
  if (parsed) *parsed = command.parsed_options();
}
}  // namespace

TEST(coldstart_cli, parses_every_option) {
  cs::options o;
  parse({"coldstart", "--runs", "3", "--loading", "eager", "--scenarios", "cubin,ptx-warm",
         "--json", "a.json", "--chart", "a.svg", "--device", "1", "--timeout", "5"},
        &o);
  EXPECT_EQ(o.runs, 3);
  EXPECT_EQ(o.loading, "eager");
  EXPECT_EQ(o.scenarios, (std::vector<std::string>{"cubin", "ptx-warm"}));
  EXPECT_EQ(o.json_path, "a.json");
  EXPECT_EQ(o.chart_path, "a.svg");
  EXPECT_EQ(o.device, 1);
  EXPECT_EQ(o.timeout_s, 5);
  parse({"coldstart"}, &o);
  EXPECT_EQ(o.runs, 10);
  EXPECT_EQ(o.loading, "both");
  EXPECT_TRUE(o.scenarios.empty());
}

TEST(coldstart_cli, refuses_bad_values) {
  EXPECT_THROW(parse({"coldstart", "--runs", "0"}), CLI::ParseError);
  EXPECT_THROW(parse({"coldstart", "--runs", "-2"}), CLI::ParseError);
  EXPECT_THROW(parse({"coldstart", "--runs", "ten"}), CLI::ParseError);
  EXPECT_THROW(parse({"coldstart", "--loading", "sometimes"}), CLI::ParseError);
  EXPECT_THROW(parse({"coldstart", "--scenarios", "cubin,warp"}), CLI::ParseError);
  EXPECT_THROW(parse({"coldstart", "--timeout", "0"}), CLI::ParseError);
  EXPECT_THROW(parse({"coldstart", "--from", "/nonexistent.json"}), CLI::ParseError);
  EXPECT_THROW(parse({"coldstart", "--from", CUBRIDGE_TOOL_PATH, "--runs", "3"}), CLI::ParseError);
}

TEST(coldstart_cli, plans_scenarios_and_modes) {
  EXPECT_EQ(cs::plan_scenarios({}).scenarios.size(), 5u);
  EXPECT_FALSE(cs::plan_scenarios({}).warm_up_only);
  const auto warm = cs::plan_scenarios({"ptx-warm"});
  EXPECT_EQ(warm.scenarios,
            (std::vector<cs::scenario>{cs::scenario::ptx_cold, cs::scenario::ptx_warm}));
  EXPECT_TRUE(warm.warm_up_only);
  const auto both = cs::plan_scenarios({"ptx-warm", "ptx-cold"});
  EXPECT_FALSE(both.warm_up_only);
  EXPECT_THROW((void)cs::plan_scenarios({"nope"}), std::invalid_argument);
  EXPECT_EQ(cs::loading_modes("both"),
            (std::vector<cs::loading_mode>{cs::loading_mode::lazy, cs::loading_mode::eager}));
  EXPECT_EQ(cs::loading_modes("eager"), (std::vector<cs::loading_mode>{cs::loading_mode::eager}));
  EXPECT_THROW((void)cs::loading_modes("x"), std::invalid_argument);
}

// --- the built tool
// -------------------------------------------------------------------------------

TEST(coldstart_tool, without_a_driver_says_so_in_one_line_and_exits_69) {
  if (driver_present())
    GTEST_SKIP() << "libcuda.so.1 is present: the no-driver path needs a machine without it";
  const auto out = run_tool({"coldstart"});
  EXPECT_EQ(out.how, cs::child_outcome::end::exited);
  EXPECT_EQ(out.exit_code, 69);
  EXPECT_EQ(out.stderr_tail, "cubridge coldstart: no CUDA driver: libcuda.so.1 not found\n");
  EXPECT_TRUE(out.stdout_lines.empty()) << joined(out.stdout_lines);
}

TEST(coldstart_tool, the_probe_without_a_driver_reports_json_and_exits_69) {
  if (driver_present()) GTEST_SKIP() << "libcuda.so.1 is present";
  const auto info = run_tool({"coldstart-probe", "--info"});
  EXPECT_EQ(info.exit_code, 69);
  ASSERT_EQ(info.stdout_lines.size(), 1u);
  const auto j = nlohmann::json::parse(info.stdout_lines[0]);
  EXPECT_EQ(j["ok"], false);
  EXPECT_EQ(j["no_driver"], true);

  cubridge::testing::temp_dir dir;
  std::ofstream(dir.path / "k.cubin") << "x";
  const auto run = run_tool({"coldstart-probe", "--scenario", "cubin", "--loading", "lazy",
                             "--cubin", (dir.path / "k.cubin").string(), "--spawned-at", "1"});
  EXPECT_EQ(run.exit_code, 69);
  const auto r = cs::interpret_child(run, cs::loading_mode::lazy, cs::scenario::cubin, 1);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.failed_phase, "driver_load");
  EXPECT_EQ(r.error, "no CUDA driver: libcuda.so.1 not found");
  ASSERT_EQ(r.phases.size(), 1u);  // process_start was measured
  EXPECT_EQ(r.phases[0].phase, "process_start");
}

TEST(coldstart_tool, the_probe_refuses_a_fifo_as_its_image_instead_of_hanging) {
  // The image is read (detail::read_regular_file) before the driver is loaded, so this runs
  // with or without one. The old std::ifstream blocked in open() until the deadline.
  cubridge::testing::temp_dir dir;
  const auto fifo = dir.path / "k.cubin";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto run = cs::run_child(
      {CUBRIDGE_TOOL_PATH,
       {"coldstart-probe", "--scenario", "cubin", "--loading", "lazy", "--cubin", fifo.string()},
       cs::environment_with({}, {}),
       60s});
  ASSERT_EQ(run.how, cs::child_outcome::end::exited) << run.describe();
  EXPECT_EQ(run.exit_code, 1);
  const auto r = cs::interpret_child(run, cs::loading_mode::lazy, cs::scenario::cubin, 1);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.error, "'" + fifo.string() + "' is a FIFO, not a regular file");
}

TEST(coldstart_tool, bad_runs_or_loading_is_a_usage_error) {
  const auto runs = run_tool({"coldstart", "--runs", "0"});
  EXPECT_EQ(runs.exit_code, 64);
  EXPECT_NE(runs.stderr_tail.find("--runs"), std::string::npos) << runs.stderr_tail;
  const auto loading = run_tool({"coldstart", "--loading", "sometimes"});
  EXPECT_EQ(loading.exit_code, 64);
  EXPECT_NE(loading.stderr_tail.find("--loading: sometimes not in {lazy,eager,both}"),
            std::string::npos)
      << loading.stderr_tail;
  const auto help = run_tool({"--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(joined(help.stdout_lines).find("coldstart"), std::string::npos);
  EXPECT_EQ(joined(help.stdout_lines).find("coldstart-probe"), std::string::npos);  // hidden
}

TEST(coldstart_tool, renders_an_earlier_json_file) {
  cubridge::testing::temp_dir dir;
  const auto in = dir.path / "in.json";
  std::ofstream(in) << cs::document(fixture()).dump(2);
  const auto out =
      run_tool({"coldstart", "--from", in.string(), "--json", (dir.path / "out.json").string(),
                "--chart", (dir.path / "out.svg").string()});
  EXPECT_EQ(out.exit_code, 1) << out.stderr_tail;  // the fixture has failed runs
  EXPECT_NE(out.stderr_tail.find("2 of 8 runs failed"), std::string::npos) << out.stderr_tail;
  EXPECT_EQ(joined(out.stdout_lines), cs::render_table(fixture(), cs::aggregate(fixture().runs)));
  EXPECT_EQ(nlohmann::json::parse(read_text(dir.path / "out.json")).get<cs::report>(), fixture());
  EXPECT_TRUE(parse_xml(read_text(dir.path / "out.svg")).ok);

  std::ofstream(dir.path / "bad.json") << "{\"runs\": 3}";
  const auto bad = run_tool({"coldstart", "--from", (dir.path / "bad.json").string()});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.stderr_tail.find("is not a coldstart JSON file"), std::string::npos)
      << bad.stderr_tail;

  // Read through detail::read_regular_file: a FIFO is refused at once (std::ifstream blocked in
  // open() until a writer came; CLI11's ExistingFile check lets a FIFO through).
  const auto fifo = dir.path / "fifo.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto from_fifo = cs::run_child({CUBRIDGE_TOOL_PATH,
                                        {"coldstart", "--from", fifo.string()},
                                        cs::environment_with({}, {}),
                                        60s});
  ASSERT_EQ(from_fifo.how, cs::child_outcome::end::exited) << from_fifo.describe();
  EXPECT_EQ(from_fifo.exit_code, 1);
  EXPECT_EQ(from_fifo.stderr_tail,
            "cubridge coldstart: '" + fifo.string() + "' is a FIFO, not a regular file\n");
}

TEST(coldstart_tool, measures_every_scenario_and_mode_in_fresh_children) {
  cubridge::testing::temp_dir dir;
  const auto probe = dir.path / "fake_probe";
  write_executable(probe, fake_probe);
  const auto json = dir.path / "cs.json";
  const auto chart = dir.path / "cs.svg";
  // CUDA_CACHE_DISABLE=1 here must not reach the children (the fake probe fails if it does).
  const auto out = run_tool({"coldstart", "--probe-command", probe.string(), "--runs", "2",
                             "--json", json.string(), "--chart", chart.string()},
                            {"CUDA_CACHE_DISABLE=1"});
  ASSERT_EQ(out.exit_code, 0) << out.stderr_tail << joined(out.stdout_lines);
  const auto rep = nlohmann::json::parse(read_text(json)).get<cs::report>();
  EXPECT_EQ(rep.machine.gpu, "Fake GPU");
  EXPECT_EQ(rep.runs_per_scenario, 2);
  ASSERT_EQ(rep.runs.size(), 2u * 2u * 5u);
  for (const auto& r : rep.runs) {
    EXPECT_TRUE(r.ok) << r.error;
    EXPECT_EQ(r.loading_reported, cs::env_value(r.loading));  // CUDA_MODULE_LOADING was set
    const double module = r.phases.at(2).ms;
    if (r.scen == cs::scenario::ptx_cold)
      EXPECT_EQ(module, 100);
    else if (r.scen == cs::scenario::ptx_warm)
      EXPECT_EQ(module, 1);  // found ptx-cold's cache
    else
      EXPECT_EQ(module, 5);  // an empty cache of its own
  }
  // Interleaved: run 1 of every mode and scenario before run 2.
  EXPECT_EQ(rep.runs[0].run, 1);
  EXPECT_EQ(rep.runs[9].run, 1);
  EXPECT_EQ(rep.runs[10].run, 2);
  EXPECT_EQ(rep.runs[5].loading, cs::loading_mode::eager);
  const auto table = joined(out.stdout_lines);
  EXPECT_NE(table.find("Fake GPU (sm_90), driver 580.0 (CUDA 13.0)"), std::string::npos) << table;
  EXPECT_NE(table.find("EAGER  PTX, JIT cache warm"), std::string::npos) << table;
  // Progress on stderr, a line per run when stderr is not a terminal.
  EXPECT_NE(out.stderr_tail.find("run 2/2 EAGER nvrtc: 225.0 ms"), std::string::npos)
      << out.stderr_tail;
  const auto svg = parse_xml(read_text(chart));
  EXPECT_TRUE(svg.ok) << svg.error;
}

TEST(coldstart_tool, a_crashing_or_hanging_child_is_reported_and_the_rest_measured) {
  cubridge::testing::temp_dir dir;
  const auto probe = dir.path / "fake_probe";
  write_executable(probe, fake_probe);
  const auto json = dir.path / "cs.json";
  const auto start = std::chrono::steady_clock::now();
  const auto out =
      run_tool({"coldstart", "--probe-command", probe.string(), "--runs", "1", "--loading", "lazy",
                "--scenarios", "cubin,ptx-warm,nvrtc", "--timeout", "1", "--json", json.string()},
               {"FAKE_CRASH=cubin", "FAKE_HANG=nvrtc"});
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
  EXPECT_EQ(out.exit_code, 1) << out.stderr_tail;
  EXPECT_NE(out.stderr_tail.find("2 of 3 runs failed"), std::string::npos) << out.stderr_tail;
  const auto rep = nlohmann::json::parse(read_text(json)).get<cs::report>();
  // ptx-cold ran only to warm the cache for ptx-warm, and is not reported.
  ASSERT_EQ(rep.runs.size(), 3u);
  EXPECT_EQ(rep.runs[0].scen, cs::scenario::cubin);
  EXPECT_FALSE(rep.runs[0].ok);
  EXPECT_EQ(rep.runs[0].failed_phase, "module_load");
  EXPECT_NE(rep.runs[0].error.find("signal 11"), std::string::npos) << rep.runs[0].error;
  EXPECT_EQ(rep.runs[1].scen, cs::scenario::ptx_warm);
  EXPECT_TRUE(rep.runs[1].ok);
  EXPECT_EQ(rep.runs[1].phases.at(2).ms, 1);  // the warm-up filled its cache
  EXPECT_EQ(rep.runs[2].scen, cs::scenario::nvrtc);
  EXPECT_FALSE(rep.runs[2].ok);
  EXPECT_EQ(rep.runs[2].failed_phase, "cu_init");
  EXPECT_NE(rep.runs[2].error.find("timed out"), std::string::npos) << rep.runs[2].error;
  const auto table = joined(out.stdout_lines);
  EXPECT_NE(table.find("FAILED run 1: module_load: the probe process killed by signal 11"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("FAILED run 1: cu_init: the probe process timed out"), std::string::npos)
      << table;
}

TEST(DriverRelease, ReadsBothKernelModuleLines) {
  using cubridge::tool::coldstart::parse_driver_release;
  EXPECT_EQ(parse_driver_release(
                "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Tue Aug 12"),
            "580.159.04");
  // The open kernel module's line, as on the H200 machine (the old parser took "for").
  EXPECT_EQ(
      parse_driver_release(
          "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build"),
      "580.159.04");
  EXPECT_EQ(parse_driver_release("no version here"), "");
  EXPECT_EQ(parse_driver_release(""), "");
}
