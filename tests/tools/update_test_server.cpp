// A stand-in service for the CLI tests: an update endpoint on a free loopback port over an
// in-memory module sink, which runs one command while it serves and exits with its status.
//
//   update_test_server --trust K.pub [--gpu 90] -- COMMAND ARGS...   ({URL} becomes the URL)
#include "tools/memory_sink.hpp"

#include <cubridge/update/update_endpoint.hpp>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char** argv) {
  std::string trust;
  int sm = 90;
  int i = 1;
  for (; i < argc && std::strcmp(argv[i], "--") != 0; ++i) {
    if (!std::strcmp(argv[i], "--trust") && i + 1 < argc)
      trust = argv[++i];
    else if (!std::strcmp(argv[i], "--gpu") && i + 1 < argc)
      sm = std::atoi(argv[++i]);
  }
  if (trust.empty() || i + 1 >= argc) {
    std::fprintf(stderr, "usage: update_test_server --trust K.pub [--gpu 90] -- COMMAND...\n");
    return 64;
  }
  try {
    const auto sink = std::make_shared<cubridge::testing::memory_sink>(
        cubridge::compute_capability{sm / 10, sm % 10});
    cubridge::update_endpoint_options options;
    options.keys.add(cubridge::read_public_key_file(trust));
    options.persist_state = false;  // a stand-in for one test: it starts fresh every time
    cubridge::update_endpoint endpoint(sink, options);
    endpoint.start();
    std::vector<std::string> words;
    for (int j = i + 1; j < argc; ++j) {
      std::string w = argv[j];
      for (std::size_t at; (at = w.find("{URL}")) != std::string::npos;)
        w.replace(at, 5, endpoint.url());
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
