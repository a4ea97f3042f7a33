#pragma once
// Sets (or unsets) an environment variable for a scope and puts back what was there, for tests
// of code that reads the environment (e.g. default_state_directory). Not thread-safe: setenv
// never is; use it where no other thread reads the environment.

#include <cstdlib>
#include <optional>
#include <string>

namespace cubridge::testing {

class scoped_env {
 public:
  /// `value` nullptr: unset.
  scoped_env(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~scoped_env() {
    if (old_)
      ::setenv(name_.c_str(), old_->c_str(), 1);
    else
      ::unsetenv(name_.c_str());
  }
  scoped_env(const scoped_env&) = delete;
  scoped_env& operator=(const scoped_env&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

}  // namespace cubridge::testing
