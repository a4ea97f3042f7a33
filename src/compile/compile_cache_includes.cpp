// The compile cache's include scan: the `#include` directives of the source, its in-memory
// headers and every file they reach, each name looked for where NVRTC looks.
#include "compile_cache_includes.hpp"

#include <cubridge/core/detail/file_io.hpp>

#include <cstdint>
#include <deque>
#include <filesystem>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace cubridge::compile_cache_internal {

namespace fs = std::filesystem;

namespace {

/// The largest file the include scan reads (compile_cache.hpp): far above any real header.
constexpr std::uint64_t max_included_file_bytes = std::uint64_t{256} << 20;

struct include_directive {
  std::string name;
  bool quoted = false;
};

/// The `#include "x"` / `#include <x>` (and #include_next) directives of `text`, line by line.
/// `#include MACRO` is not resolved; `#if` is not evaluated (so this may find too many).
std::vector<include_directive> find_includes(std::string_view text) {
  std::vector<include_directive> found;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    auto skip_blanks = [&line] {
      while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
    };
    skip_blanks();
    if (line.empty() || line.front() != '#') continue;
    line.remove_prefix(1);
    skip_blanks();
    if (line.starts_with("include_next")) {
      line.remove_prefix(12);
    } else if (line.starts_with("include")) {
      line.remove_prefix(7);
    } else {
      continue;
    }
    skip_blanks();
    if (line.empty()) continue;
    const char open = line.front();
    if (open != '"' && open != '<') continue;
    const char close = open == '"' ? '"' : '>';
    const std::size_t stop = line.find(close, 1);
    if (stop == std::string_view::npos || stop == 1) continue;
    found.push_back({std::string(line.substr(1, stop - 1)), open == '"'});
  }
  return found;
}

/// The content of an included file: a regular file of at most max_included_file_bytes, opened
/// without blocking (detail::read_regular_file), so a file swapped for a FIFO after the scan
/// checked it is refused instead of hanging the lookup.
std::string read_whole_file(const fs::path& path) {
  const auto bytes = detail::read_regular_file(path, max_included_file_bytes, "included file");
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

fs::path directory_of(std::string_view name) {
  const fs::path parent = fs::path(name).parent_path();
  return fs::absolute(parent.empty() ? fs::path(".") : parent).lexically_normal();
}

/// Where the scan looks for a name besides the including file's directory, and what the
/// options ask to include before the source.
struct include_search {
  /// The include paths, then -I / --include-path of extra_options, in order.
  std::vector<fs::path> directories;
  /// --pre-include / -include of extra_options, in order.
  std::vector<std::string> pre_includes;
};

include_search search_of(const compile_options& options) {
  include_search search;
  for (const auto& path : options.include_paths) search.directories.push_back(path);
  for (std::string_view option : options.extra_options) {
    if (option.starts_with("--include-path=")) {
      search.directories.emplace_back(option.substr(15));
    } else if (option.starts_with("-I")) {
      option.remove_prefix(2);
      if (option.starts_with("=")) option.remove_prefix(1);
      search.directories.emplace_back(option);
    } else if (option.starts_with("--pre-include=")) {
      search.pre_includes.emplace_back(option.substr(14));
    } else if (option.starts_with("-include")) {
      option.remove_prefix(8);
      if (option.starts_with("=")) option.remove_prefix(1);
      search.pre_includes.emplace_back(option);
    }
  }
  return search;
}

/// A text still to scan, and the directory its quoted includes are looked for in first.
struct pending {
  std::string text;
  fs::path directory;
};

/// What the scan starts from: the source, each in-memory header, and the pre-includes as if
/// the source included them.
std::deque<pending> starting_texts(const cuda_source& source, const compile_options& options,
                                   const std::vector<std::string>& pre_includes) {
  std::deque<pending> work;
  const fs::path source_directory = directory_of(source.name);
  work.push_back({source.text, source_directory});
  for (const auto& header : options.headers)
    work.push_back({header.content, directory_of(header.name)});
  std::string pre;
  for (const auto& name : pre_includes) pre += "#include \"" + name + "\"\n";
  if (!pre.empty()) work.push_back({std::move(pre), source_directory});
  return work;
}

/// Every place NVRTC may find `directive`, in its order: an absolute name as it is; else the
/// including file's directory (quoted names only), then each search directory.
std::vector<fs::path> candidates_of(const include_directive& directive,
                                    const fs::path& including_directory,
                                    const std::vector<fs::path>& search) {
  std::vector<fs::path> candidates;
  const fs::path spelled(directive.name);
  if (spelled.is_absolute()) {
    candidates.push_back(spelled);
  } else {
    if (directive.quoted) candidates.push_back(including_directory / spelled);
    for (const auto& directory : search) candidates.push_back(directory / spelled);
  }
  return candidates;
}

}  // namespace

std::map<std::string, std::string> scan_includes(const cuda_source& source,
                                                 const compile_options& options) {
  const include_search search = search_of(options);
  std::deque<pending> work = starting_texts(source, options, search.pre_includes);
  std::map<std::string, std::string> files;
  while (!work.empty()) {
    const pending item = std::move(work.front());
    work.pop_front();
    for (const auto& directive : find_includes(item.text)) {
      // Every file found is hashed, not only the first (compile_cache.hpp).
      for (const auto& candidate : candidates_of(directive, item.directory, search.directories)) {
        std::error_code ec;
        if (!fs::is_regular_file(candidate, ec)) continue;
        std::string path = fs::absolute(candidate).lexically_normal().string();
        if (files.contains(path)) continue;
        std::string content = read_whole_file(path);
        work.push_back({content, fs::path(path).parent_path()});
        files.emplace(std::move(path), std::move(content));
      }
    }
  }
  return files;
}

}  // namespace cubridge::compile_cache_internal
