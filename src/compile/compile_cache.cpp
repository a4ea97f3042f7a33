// The compile cache's public face: the state of one open cache, lookups with threads of the
// same cache waiting for each other's compile, and the compile_cache methods. The keys, the
// include scan, the directory checks, the entry format and the store are in compile_cache_*.cpp.
// compile_cache.hpp documents the behaviour, docs/compile-cache.md the trust model.
#include <cubridge/compile/compile_cache.hpp>
#include <cubridge/core/detail/hex.hpp>
#include <cubridge/core/detail/user_directory.hpp>
#include <cubridge/core/error.hpp>
#include <cubridge/core/unique_fd.hpp>

#include "compile_cache_directory.hpp"
#include "compile_cache_entry.hpp"
#include "compile_cache_key.hpp"
#include "compile_cache_store.hpp"

#include <sodium.h>

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace cubridge {

namespace fs = std::filesystem;
using compile_cache_internal::compile_key;
using compile_cache_internal::current_toolkit_versions;
using compile_cache_internal::encode_entry;
using compile_cache_internal::entry_name;
using compile_cache_internal::hash_value;
using compile_cache_internal::link_key;
using compile_cache_internal::load_or_create_mac_key;
using compile_cache_internal::mac_key;
using compile_cache_internal::mac_key_name;
using compile_cache_internal::open_cache_directory;
using compile_cache_internal::read_entry;
using compile_cache_internal::read_outcome;
using compile_cache_internal::remove_if_same;
using compile_cache_internal::store_entry;
using compile_cache_internal::toolkit_versions;
using compile_cache_internal::trim_directory;
using detail::to_hex;

struct compile_cache::state {
  fs::path directory;
  // Everything is opened relative to this descriptor of the checked directory, never by path:
  // renaming or replacing the path after open() changes nothing.
  unique_fd directory_fd;
  mac_key secret{};
  std::uint64_t max_bytes = 0;
  toolkit_versions versions;

  std::atomic<std::uint64_t> hits{0};
  std::atomic<std::uint64_t> misses{0};
  std::atomic<std::uint64_t> corrupt_dropped{0};
  std::atomic<std::uint64_t> refused{0};
  std::atomic<std::uint64_t> evicted{0};
  std::atomic<std::uint64_t> store_failures{0};

  state() = default;
  state(const state&) = delete;
  state& operator=(const state&) = delete;
  ~state() { sodium_memzero(secret.data(), secret.size()); }

  // Keys being compiled by some thread of this cache; others wait for that result.
  std::mutex in_flight_mutex;
  std::unordered_map<std::string, std::shared_future<compiled_image>> in_flight;
  // One trim at a time in this process (across processes a race only removes a file twice).
  std::mutex trim_mutex;

  fs::path entry_path(std::string_view key_hex) const { return directory / entry_name(key_hex); }

  /// Reads the entry; drops it if it is a corrupt file of ours, skips it if it is refused
  /// (counted once per lookup: `refusal_counted` carries that from the first read).
  bool try_read(const hash_value& key, const std::string& key_hex, compiled_image& out,
                bool& refusal_counted) {
    const std::string name = entry_name(key_hex);
    struct stat found {};
    switch (read_entry(directory_fd.get(), name, secret, key, out, found)) {
      case read_outcome::hit:
        return true;
      case read_outcome::absent:
        return false;
      case read_outcome::corrupt:
        if (remove_if_same(directory_fd.get(), name, found)) corrupt_dropped.fetch_add(1);
        return false;
      case read_outcome::refused:
        if (!refusal_counted) refused.fetch_add(1);
        refusal_counted = true;
        // Ours but writable by others: its content cannot be trusted, and it is ours to
        // remove. Anything else (a link, a FIFO, another user's file) is left alone; the
        // store renames a new entry over the name.
        if (S_ISREG(found.st_mode) && found.st_uid == ::geteuid())
          remove_if_same(directory_fd.get(), name, found);
        return false;
    }
    return false;
  }

  compiled_image get_or_make(const hash_value& key, const std::function<compiled_image()>& make) {
    const std::string key_hex = to_hex(key);
    compiled_image image;
    bool refusal_counted = false;
    if (try_read(key, key_hex, image, refusal_counted)) {
      hits.fetch_add(1);
      return image;
    }
    std::promise<compiled_image> promise;
    {
      std::unique_lock lock(in_flight_mutex);
      if (auto it = in_flight.find(key_hex); it != in_flight.end()) {
        std::shared_future<compiled_image> pending = it->second;
        lock.unlock();
        image = pending.get();  // rethrows the compile's exception
        hits.fetch_add(1);
        return image;
      }
      in_flight.emplace(key_hex, promise.get_future().share());
    }
    auto finish = [&](auto&& set) {
      set();
      std::lock_guard lock(in_flight_mutex);
      in_flight.erase(key_hex);
    };
    try {
      // A thread that held the key until just now may have stored it.
      if (try_read(key, key_hex, image, refusal_counted)) {
        hits.fetch_add(1);
      } else {
        image = make();
        misses.fetch_add(1);
        if (store_entry(directory_fd.get(), key_hex, encode_entry(secret, key, image))) {
          trim_quietly();
        } else {
          store_failures.fetch_add(1);
        }
      }
    } catch (...) {
      finish([&] { promise.set_exception(std::current_exception()); });
      throw;
    }
    finish([&] { promise.set_value(image); });
    return image;
  }

  void trim_quietly() noexcept {
    try {
      trim();
    } catch (...) {
      // A failed eviction pass only leaves the directory over its limit until the next one.
    }
  }

  /// Evicts and cleans up, touching only the cache's own files: "<64 hex>.entry" and
  /// ".tmp-cubridge-..." names that are regular files of the user's. Everything else in the
  /// directory (other names, links, FIFOs, directories, other users' files) is left alone.
  void trim() {
    std::lock_guard lock(trim_mutex);
    trim_directory(directory_fd.get(), directory, max_bytes, evicted);
  }
};

compile_cache::compile_cache(std::unique_ptr<state> s) noexcept : state_(std::move(s)) {}
compile_cache::compile_cache(compile_cache&&) noexcept = default;
compile_cache& compile_cache::operator=(compile_cache&&) noexcept = default;
compile_cache::~compile_cache() = default;

fs::path compile_cache::default_directory() {
  if (auto dir = detail::user_directory("CUBRIDGE_CACHE_DIR", "XDG_CACHE_HOME", ".cache"))
    return *dir;
  detail::throw_errc(errc::io, "compile_cache::default_directory",
                     "no cache directory: set CUBRIDGE_CACHE_DIR, XDG_CACHE_HOME or HOME");
}

compile_cache compile_cache::open(const fs::path& directory, std::uint64_t max_bytes) {
  CUBRIDGE_EXPECTS(max_bytes > 0, "opening compile cache '" + directory.string() + "'");
  auto s = std::make_unique<state>();
  s->directory = directory;
  s->directory_fd = open_cache_directory(directory);
  s->secret = load_or_create_mac_key(s->directory_fd.get(), directory);
  s->max_bytes = max_bytes;
  s->versions = current_toolkit_versions();
  s->trim();
  return compile_cache(std::move(s));
}

compile_cache compile_cache::open_default(std::uint64_t max_bytes) {
  return open(default_directory(), max_bytes);
}

compiled_image compile_cache::get_or_compile(const cuda_source& source,
                                             const compile_options& options) {
  return state_->get_or_make(compile_key(state_->versions, source, options),
                             [&] { return nvrtc_compile(source, options); });
}

compiled_image compile_cache::get_or_link(std::string_view ptx, const ptx_link_options& options) {
  return state_->get_or_make(link_key(state_->versions, ptx, options),
                             [&] { return ptx_to_cubin(ptx, options); });
}

std::string compile_cache::key_for(const cuda_source& source,
                                   const compile_options& options) const {
  return to_hex(compile_key(state_->versions, source, options));
}

std::string compile_cache::key_for(std::string_view ptx, const ptx_link_options& options) const {
  return to_hex(link_key(state_->versions, ptx, options));
}

fs::path compile_cache::entry_path(std::string_view key) const {
  return state_->entry_path(key);
}

fs::path compile_cache::key_path() const {
  return state_->directory / mac_key_name;
}

const fs::path& compile_cache::directory() const noexcept {
  return state_->directory;
}

std::uint64_t compile_cache::max_bytes() const noexcept {
  return state_->max_bytes;
}

compile_cache_stats compile_cache::stats() const noexcept {
  return {.hits = state_->hits.load(),
          .misses = state_->misses.load(),
          .corrupt_dropped = state_->corrupt_dropped.load(),
          .refused = state_->refused.load(),
          .evicted = state_->evicted.load(),
          .store_failures = state_->store_failures.load()};
}

void compile_cache::trim() {
  state_->trim();
}

}  // namespace cubridge
