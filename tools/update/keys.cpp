// `cubridge keygen --out NAME`: NAME.pub and NAME.key in the text forms of bundle.hpp.
#include "exit_codes.hpp"
#include "update/update_commands.hpp"

#include <cubridge/bundle/bundle.hpp>
#include <cubridge/core/detail/file_io.hpp>

#include <cstring>
#include <filesystem>
#include <iostream>

#include <sys/stat.h>

namespace cubridge::tool {

int update_commands::keygen() const {
  const std::filesystem::path pub = keygen_args_.out + ".pub";
  const std::filesystem::path key = keygen_args_.out + ".key";
  const bool replace = keygen_args_.force;
  // Anything at either name counts, a symlink too (even a dangling one): it is never followed.
  if (!replace)
    for (const auto& p : {pub, key}) {
      struct ::stat st {};
      if (::lstat(p.c_str(), &st) == 0) {
        std::cerr << "cubridge: " << p.string() << " exists; --force replaces it\n";
        return exit_failure;
      }
    }
  const auto pair = generate_keypair();
  // Each through a fresh file moved into place (detail/file_io.hpp): a symlink at the name is
  // replaced, not written through; without --force the move also refuses a file that appeared
  // since the check above. The public key first, so that a failure leaves no secret behind.
  const auto public_text = to_text(pair.public_key);
  detail::write_file_atomically(pub, std::as_bytes(std::span(public_text)), 0644, replace,
                                "key file");
  auto secret_text = to_text(pair.secret_key);
  try {
    detail::write_file_atomically(key, std::as_bytes(std::span(secret_text)), 0600, replace,
                                  "key file");
  } catch (...) {
    ::explicit_bzero(secret_text.data(), secret_text.size());
    throw;
  }
  ::explicit_bzero(secret_text.data(), secret_text.size());
  std::cout << "key id " << to_hex(pair.public_key.id()) << "\n"
            << "  public  " << pub.string() << "  (give it to the services that trust you)\n"
            << "  secret  " << key.string() << "  (mode 0600; keep it secret)\n";
  return exit_ok;
}

}  // namespace cubridge::tool
