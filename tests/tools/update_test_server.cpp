// A stand-in service for the CLI tests: an update endpoint on a free loopback port over an
// in-memory module sink, which runs one command while it serves and exits with its status.
//
//   update_test_server --trust K.pub [--gpu 90] -- COMMAND ARGS...   ({URL} becomes the URL)
#include <cubridge/update_endpoint.hpp>

#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

namespace {

// Versions in memory: the current one and one to roll back to, as hot_module keeps them.
class memory_sink final : public cubridge::module_sink {
 public:
  explicit memory_sink(int sm) : sm_(sm) {}
  int device_sm() const override { return sm_; }
  std::uint64_t current_version(std::string_view name) const override {
    std::lock_guard lock(mutex_);
    const auto it = modules_.find(std::string(name));
    return it == modules_.end() ? 0 : it->second.first;
  }
  cubridge::sink_result apply(const cubridge::verified_bundle& bundle) override {
    std::lock_guard lock(mutex_);
    auto& [current, previous] = modules_[bundle.manifest.name];
    previous = current;
    current = bundle.version();
    return {cubridge::sink_outcome::done, current, {}};
  }
  cubridge::sink_result rollback(std::string_view name) override {
    std::lock_guard lock(mutex_);
    const auto it = modules_.find(std::string(name));
    if (it == modules_.end()) return {cubridge::sink_outcome::unknown_module, 0, "no such module"};
    auto& [current, previous] = it->second;
    if (previous == 0) return {cubridge::sink_outcome::no_previous_version, current, "none"};
    std::swap(current, previous);
    return {cubridge::sink_outcome::done, current, {}};
  }
  std::vector<cubridge::module_report> status() const override {
    std::lock_guard lock(mutex_);
    std::vector<cubridge::module_report> out;
    for (const auto& [name, v] : modules_) out.push_back({name, v.first, {v.second, v.first}, 0, {}});
    return out;
  }

 private:
  int sm_;
  mutable std::mutex mutex_;
  std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> modules_;
};

}  // namespace

int main(int argc, char** argv) {
  std::string trust;
  int sm = 90;
  int i = 1;
  for (; i < argc && std::strcmp(argv[i], "--") != 0; ++i) {
    if (!std::strcmp(argv[i], "--trust") && i + 1 < argc) trust = argv[++i];
    else if (!std::strcmp(argv[i], "--gpu") && i + 1 < argc) sm = std::atoi(argv[++i]);
  }
  if (trust.empty() || i + 1 >= argc) {
    std::fprintf(stderr, "usage: update_test_server --trust K.pub [--gpu 90] -- COMMAND...\n");
    return 64;
  }
  try {
    memory_sink sink(sm);
    cubridge::update_endpoint_options options;
    options.keys.add(cubridge::read_public_key_file(trust));
    cubridge::update_endpoint endpoint(sink, options);
    endpoint.start();
    std::vector<std::string> words;
    for (int j = i + 1; j < argc; ++j) {
      std::string w = argv[j];
      for (std::size_t at; (at = w.find("{URL}")) != std::string::npos;) w.replace(at, 5, endpoint.url());
      words.push_back(std::move(w));
    }
    std::vector<char*> child_argv;
    for (auto& w : words) child_argv.push_back(w.data());
    child_argv.push_back(nullptr);
    std::fflush(nullptr);
    const pid_t child = ::fork();
    if (child == 0) {
      ::execvp(child_argv[0], child_argv.data());
      std::perror("exec");
      ::_exit(127);
    }
    int status = 0;
    ::waitpid(child, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "update_test_server: %s\n", e.what());
    return 1;
  }
}
