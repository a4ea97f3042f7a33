#include "coldstart.hpp"

#include "../exit_codes.hpp"
#include "aggregate.hpp"
#include "kernel_source.hpp"
#include "render_svg.hpp"
#include "render_table.hpp"

#include <cubridge/core/detail/file_io.hpp>
#include <cubridge/core/error.hpp>

#include <nlohmann/json.hpp>

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>

namespace cubridge::tool::coldstart {
namespace {

namespace fs = std::filesystem;

/// A failure of the command (not of one child): printed as "cubridge coldstart: <what>".
struct command_error : std::runtime_error {
  command_error(const std::string& what, int status_) : std::runtime_error(what), status(status_) {}
  int status;
};

/// A private directory for the kernel images and JIT caches, removed with everything in it.
class temp_dir {
 public:
  temp_dir() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/cubridge-coldstart-XXXXXX";
    if (!::mkdtemp(pattern.data()))
      throw command_error("cannot create a temporary directory " + pattern, exit_failure);
    path_ = pattern;
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  [[nodiscard]] const fs::path& path() const noexcept { return path_; }

 private:
  fs::path path_;
};

void write_file(const fs::path& path, std::string_view content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(content.data(), static_cast<std::streamsize>(content.size()));
  out.close();
  if (!out) throw command_error("cannot write " + path.string(), exit_failure);
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

/// The last stdout line that is a JSON object, parsed; null if there is none.
nlohmann::json last_json_line(const child_outcome& outcome) {
  for (auto it = outcome.stdout_lines.rbegin(); it != outcome.stdout_lines.rend(); ++it) {
    if (it->empty() || it->front() != '{') continue;
    auto j = nlohmann::json::parse(*it, nullptr, false);
    if (!j.is_discarded() && j.is_object()) return j;
  }
  return nullptr;
}

/// The last few lines of a child's stderr, for error messages.
std::string stderr_excerpt(const std::string& tail, std::size_t max_lines = 6) {
  std::string s = tail;
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  std::size_t pos = s.size();
  for (std::size_t lines = 0; lines < max_lines && pos != std::string::npos && pos > 0; ++lines)
    pos = s.rfind('\n', pos - 1);
  return pos == std::string::npos || pos == 0 ? s : s.substr(pos + 1);
}

/// Progress on stderr: one line updated in place on a terminal, a line per run otherwise.
class progress {
 public:
  explicit progress(int total) : tty_(::isatty(2) == 1), total_(total) {}

  void start(int index, int run, int runs, loading_mode mode, scenario scen, bool warm_up) {
    char head[64];
    std::snprintf(head, sizeof head, "coldstart [%*d/%d] ",
                  static_cast<int>(std::to_string(total_).size()), index, total_);
    prefix_ = head + std::string("run ") + std::to_string(run) + "/" + std::to_string(runs) + " " +
              std::string(env_value(mode)) + " " + std::string(to_string(scen)) +
              (warm_up ? " (JIT cache warm-up)" : "") + ": ";
    show(prefix_ + "starting");
  }
  void phase(std::string_view key) {
    if (key == "exit") return show(prefix_ + "exiting");
    const auto* p = find_phase(key);
    show(prefix_ + (p ? std::string(p->label) : std::string(key)) + "...");
  }
  void finish(const run_result& r) {
    std::string line = prefix_;
    if (r.ok) {
      char ms[32];
      std::snprintf(ms, sizeof ms, "%.1f ms", total_ms(r));
      line += ms;
    } else {
      std::string error = r.error.substr(0, r.error.find('\n'));
      line += "FAILED in " + r.failed_phase + ": " + error;
    }
    if (tty_ && r.ok) {
      show(line);
    } else {
      std::fprintf(stderr, "%s%s\n", tty_ ? "\r\033[K" : "", line.c_str());
      std::fflush(stderr);
    }
  }
  void done() {
    if (tty_) {
      std::fputs("\r\033[K", stderr);
      std::fflush(stderr);
    }
  }

 private:
  void show(const std::string& text) {
    if (!tty_) return;
    std::fprintf(stderr, "\r\033[K%s", text.substr(0, 110).c_str());
    std::fflush(stderr);
  }
  bool tty_;
  int total_;
  std::string prefix_;
};

/// The report `--from` names: a regular file of at most 64 MiB (detail::read_regular_file), so
/// a FIFO or a device is refused at once instead of blocking the command.
report load_report(const std::string& path) {
  std::vector<std::byte> bytes;
  try {
    bytes = cubridge::detail::read_regular_file(path, std::uint64_t{64} << 20, "coldstart report");
  } catch (const cubridge::error& e) {
    throw command_error(e.involved(), exit_failure);
  }
  const auto* first = reinterpret_cast<const char*>(bytes.data());
  try {
    return nlohmann::json::parse(first, first + bytes.size()).get<report>();
  } catch (const std::exception& e) {
    throw command_error(path + " is not a coldstart JSON file: " + e.what(), exit_failure);
  }
}

machine_info query_machine(const std::string& self, const options& o) {
  const auto outcome =
      run_child({self,
                 {"coldstart-probe", "--info", "--device", std::to_string(o.device)},
                 environment_with({}),
                 std::chrono::seconds(o.timeout_s)});
  const auto j = last_json_line(outcome);
  if (j.is_null()) {
    std::string message = "the probe process " + outcome.describe();
    if (const auto err = stderr_excerpt(outcome.stderr_tail); !err.empty()) message += ":\n" + err;
    throw command_error(message, exit_failure);
  }
  if (!j.value("ok", false))
    throw command_error(j.value("error", std::string("the probe failed")),
                        j.value("no_driver", false) ? exit_no_driver : exit_failure);
  return j.at("machine").get<machine_info>();
}

/// The kernel, compiled for the device, as the files the probes load.
struct kernel_files {
  fs::path cubin;
  fs::path ptx;
};

kernel_files write_kernels(const fs::path& dir, int sm) {
  kernel_files files{dir / "coldstart_kernel.cubin", dir / "coldstart_kernel.ptx"};
  try {
    const auto cubin_bytes = compile_kernel("sm_" + std::to_string(sm));
    const auto ptx_bytes = compile_kernel("compute_" + std::to_string(sm));
    write_file(files.cubin, {cubin_bytes.data(), cubin_bytes.size()});
    write_file(files.ptx, {ptx_bytes.data(), ptx_bytes.size()});
  } catch (const command_error&) {
    throw;
  } catch (const std::exception& e) {
    throw command_error(
        std::string("cannot compile the kernel for sm_") + std::to_string(sm) + ": " + e.what(),
        exit_failure);
  }
  return files;
}

void announce(const machine_info& machine, const options& o, const std::vector<loading_mode>& modes,
              const run_plan& plan, int total) {
  std::fprintf(stderr,
               "cubridge coldstart: %s; %d fresh processes (%d run%s x %zu scenario%s x %s)\n",
               describe_machine(machine).c_str(), total, o.runs, o.runs == 1 ? "" : "s",
               plan.scenarios.size(), plan.scenarios.size() == 1 ? "" : "s",
               o.loading == "both" ? "LAZY, EAGER" : std::string(env_value(modes.front())).c_str());
}

/// One fresh probe process: `scen` under `mode`, its JIT cache in `cache`.
run_result run_probe(const std::string& self, const options& o, const kernel_files& kernel,
                     loading_mode mode, scenario scen, int run, const fs::path& cache,
                     progress& show) {
  const long long spawned_at = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count();
  const auto outcome =
      run_child({self,
                 {"coldstart-probe", "--scenario", std::string(to_string(scen)), "--loading",
                  std::string(to_string(mode)), "--cubin", kernel.cubin.string(), "--ptx",
                  kernel.ptx.string(), "--device", std::to_string(o.device), "--spawned-at",
                  std::to_string(spawned_at)},
                 environment_with({"CUDA_MODULE_LOADING=" + std::string(env_value(mode)),
                                   "CUDA_CACHE_PATH=" + cache.string()},
                                  {"CUDA_CACHE_DISABLE"}),
                 std::chrono::seconds(o.timeout_s)},
                [&](const std::string& line) {
                  if (line.starts_with("phase ")) show.phase(std::string_view(line).substr(6));
                });
  return interpret_child(outcome, mode, scen, run);
}

/// Notes, once each, a driver that reports another loading mode than the one it was given.
void note_loading_mismatch(std::vector<std::string>& warnings, const run_result& result,
                           loading_mode mode) {
  if (!result.ok || result.loading_reported.empty() || result.loading_reported == env_value(mode))
    return;
  std::string w = "CUDA_MODULE_LOADING=" + std::string(env_value(mode)) +
                  " but the driver reports " + result.loading_reported;
  if (std::find(warnings.begin(), warnings.end(), w) == warnings.end())
    warnings.push_back(std::move(w));
}

report measure(const options& o) {
  const std::string self =
      o.probe_command.empty() ? fs::read_symlink("/proc/self/exe").string() : o.probe_command;
  report rep;
  rep.machine = query_machine(self, o);
  rep.runs_per_scenario = o.runs;
  rep.created = utc_now();

  temp_dir dir;
  const kernel_files kernel = write_kernels(dir.path(), rep.machine.compute_capability);
  const auto modes = loading_modes(o.loading);
  const auto plan = plan_scenarios(o.scenarios);
  const int total = o.runs * static_cast<int>(modes.size() * plan.scenarios.size());
  announce(rep.machine, o, modes, plan, total);
  progress show(total);
  int index = 0;
  std::vector<std::string> mismatch_warnings;
  for (int run = 1; run <= o.runs; ++run) {
    for (const loading_mode mode : modes) {
      // One JIT cache per run and mode: ptx-cold fills it, ptx-warm finds it filled.
      const fs::path ptx_cache =
          dir.path() / ("jit-" + std::string(to_string(mode)) + "-" + std::to_string(run));
      for (const scenario scen : plan.scenarios) {
        const bool uses_ptx = scen == scenario::ptx_cold || scen == scenario::ptx_warm;
        const bool warm_up = scen == scenario::ptx_cold && plan.warm_up_only;
        const fs::path cache =
            uses_ptx ? ptx_cache
                     : dir.path() / ("jit-" + std::string(to_string(mode)) + "-" +
                                     std::to_string(run) + "-" + std::string(to_string(scen)));
        fs::create_directories(cache);
        show.start(++index, run, o.runs, mode, scen, warm_up);
        auto result = run_probe(self, o, kernel, mode, scen, run, cache, show);
        show.finish(result);
        note_loading_mismatch(mismatch_warnings, result, mode);
        if (!warm_up) rep.runs.push_back(std::move(result));
      }
    }
  }
  show.done();
  for (const auto& w : mismatch_warnings)
    std::fprintf(stderr, "cubridge coldstart: warning: %s\n", w.c_str());
  return rep;
}

int run_or_render(const options& o) {
  const report rep = o.from_path.empty() ? measure(o) : load_report(o.from_path);
  const auto summary = aggregate(rep.runs);
  std::cout << render_table(rep, summary) << std::flush;
  if (!o.json_path.empty()) {
    nlohmann::json doc = document(rep);
    write_file(o.json_path, doc.dump(2) + "\n");
    std::fprintf(stderr, "cubridge coldstart: wrote %s\n", o.json_path.c_str());
  }
  if (!o.chart_path.empty()) {
    write_file(o.chart_path, render_svg(rep, summary));
    std::fprintf(stderr, "cubridge coldstart: wrote %s\n", o.chart_path.c_str());
  }
  const auto failed =
      std::count_if(rep.runs.begin(), rep.runs.end(), [](const run_result& r) { return !r.ok; });
  if (failed > 0) {
    std::fprintf(stderr, "cubridge coldstart: %ld of %zu runs failed (see the table)\n",
                 static_cast<long>(failed), rep.runs.size());
    return exit_failure;
  }
  return exit_ok;
}

}  // namespace

std::vector<loading_mode> loading_modes(const std::string& loading) {
  if (loading == "both") return {loading_mode::lazy, loading_mode::eager};
  if (const auto m = parse_loading(loading)) return {*m};
  throw std::invalid_argument("unknown loading mode '" + loading + "' (lazy, eager or both)");
}

run_plan plan_scenarios(const std::vector<std::string>& keys) {
  run_plan plan;
  const auto wanted = [&](scenario s) {
    return keys.empty() || std::find(keys.begin(), keys.end(), to_string(s)) != keys.end();
  };
  for (const auto& key : keys)
    if (!parse_scenario(key)) throw std::invalid_argument("unknown scenario '" + key + "'");
  for (const auto& info : scenarios()) {
    if (wanted(info.id)) {
      plan.scenarios.push_back(info.id);
    } else if (info.id == scenario::ptx_cold && wanted(scenario::ptx_warm)) {
      plan.scenarios.push_back(info.id);
      plan.warm_up_only = true;
    }
  }
  return plan;
}

run_result interpret_child(const child_outcome& outcome, loading_mode loading, scenario scen,
                           int run) {
  std::string last_phase = "start";
  for (const auto& line : outcome.stdout_lines)
    if (line.starts_with("phase ")) last_phase = line.substr(6);

  run_result r;
  bool reported = false;
  if (const auto j = last_json_line(outcome); !j.is_null() && j.contains("scenario")) {
    try {
      r = j.get<run_result>();
      reported = true;
    } catch (const std::exception&) {
      reported = false;
    }
  }
  r.run = run;
  r.loading = loading;
  r.scen = scen;
  const bool clean_exit =
      outcome.how == child_outcome::end::exited && (outcome.exit_code == 0 || !r.ok);
  const std::string err = stderr_excerpt(outcome.stderr_tail);
  if (!reported) {
    r.ok = false;
    r.failed_phase = last_phase;
    r.error = "the probe process " + outcome.describe() + (err.empty() ? "" : ":\n" + err);
  } else if (!clean_exit) {
    r.error =
        (r.ok ? "the probe process " + outcome.describe() + " after reporting its measurements"
              : r.error + "; then the probe process " + outcome.describe()) +
        (err.empty() ? "" : ":\n" + err);
    r.ok = false;
    r.failed_phase = last_phase;
  } else if (!r.ok && !err.empty() && r.error.find(err) == std::string::npos) {
    r.error += "\n" + err;
  }
  return r;
}

command::command(CLI::App& app) {
  coldstart_ = app.add_subcommand(
      "coldstart",
      "Time each phase of a CUDA program's start, each run in a fresh process (table, JSON, "
      "SVG chart)");
  coldstart_->footer(
      "Phases: process start, driver load (dlopen + cuGetProcAddress), cuInit, first context "
      "(cuDevicePrimaryCtxRetain or cuCtxCreate), first cuMemAlloc, NVRTC compile, module load "
      "(cubin, PTX with a cold or warm JIT cache, NVRTC's cubin), cuModuleGetFunction, first and "
      "second launch, cuBLAS load (dlopen), cublasCreate; under CUDA_MODULE_LOADING=LAZY and "
      "EAGER.\n"
      "Exit status: 0 all runs measured, 1 some run failed, 64 bad command line, 69 no CUDA "
      "driver or device.");
  coldstart_->add_option("--runs", options_.runs, "Runs per scenario and loading mode")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  coldstart_->add_option("--loading", options_.loading, "CUDA_MODULE_LOADING of the children")
      ->check(CLI::IsMember({"lazy", "eager", "both"}))
      ->capture_default_str();
  std::vector<std::string> keys;
  for (const auto& s : scenarios()) keys.emplace_back(s.key);
  coldstart_
      ->add_option("--scenarios", options_.scenarios,
                   "Scenarios to run, comma-separated (default: all)")
      ->delimiter(',')
      ->check(CLI::IsMember(keys));
  coldstart_->add_option("--json", options_.json_path,
                         "Write every run's numbers, the summary and the machine as JSON");
  coldstart_->add_option("--chart", options_.chart_path,
                         "Write a stacked-bar chart of the medians as SVG");
  auto* from = coldstart_->add_option(
      "--from", options_.from_path,
      "Measure nothing: read a file written by --json and print its table (and --json/--chart)");
  from->check(CLI::ExistingFile);
  coldstart_->add_option("--device", options_.device, "CUDA device ordinal")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  coldstart_
      ->add_option("--timeout", options_.timeout_s,
                   "Seconds after which a child is killed and reported")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
  coldstart_->add_option("--probe-command", options_.probe_command)->group("");
  from->excludes(coldstart_->get_option("--runs"));
  from->excludes(coldstart_->get_option("--loading"));
  from->excludes(coldstart_->get_option("--scenarios"));
  from->excludes(coldstart_->get_option("--device"));

  // The child: hidden from --help (empty group).
  probe_ = app.add_subcommand("coldstart-probe", "one timed start (the child of coldstart)");
  probe_->group("");
  probe_->add_flag("--info", probe_options_.info);
  probe_->add_option("--scenario", probe_options_.scenario);
  probe_->add_option("--loading", probe_options_.loading);
  probe_->add_option("--cubin", probe_options_.cubin_path);
  probe_->add_option("--ptx", probe_options_.ptx_path);
  probe_->add_option("--device", probe_options_.device);
  probe_->add_option("--spawned-at", probe_options_.spawned_at_ns);
}

bool command::parsed() const {
  return coldstart_->parsed() || probe_->parsed();
}

int command::run() const noexcept {
  if (probe_->parsed()) return run_probe(probe_options_);
  return run_coldstart(options_);
}

int run_coldstart(const options& o) noexcept {
  try {
    return run_or_render(o);
  } catch (const command_error& e) {
    std::fprintf(stderr, "cubridge coldstart: %s\n", e.what());
    return e.status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cubridge coldstart: %s\n", e.what());
    return exit_failure;
  } catch (...) {
    std::fprintf(stderr, "cubridge coldstart: unknown error\n");
    return exit_failure;
  }
}

}  // namespace cubridge::tool::coldstart
