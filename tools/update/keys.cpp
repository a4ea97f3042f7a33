// `cubridge keygen --out NAME`: NAME.pub and NAME.key in the text forms of bundle.hpp.
#include "exit_codes.hpp"
#include "update/update_commands.hpp"

#include <cubridge/bundle.hpp>

#include <filesystem>
#include <iostream>

namespace cubridge::tool {

int update_commands::keygen() const {
  const std::filesystem::path pub = keygen_args_.out + ".pub";
  const std::filesystem::path key = keygen_args_.out + ".key";
  if (!keygen_args_.force)
    for (const auto& p : {pub, key})
      if (std::filesystem::exists(p)) {
        std::cerr << "cubridge: " << p.string() << " exists; --force replaces it\n";
        return exit_failure;
      }
  const auto pair = generate_keypair();
  write_key_file(key, pair.secret_key);  // mode 0600
  write_key_file(pub, pair.public_key);
  std::cout << "key id " << to_hex(pair.public_key.id()) << "\n"
            << "  public  " << pub.string() << "  (give it to the services that trust you)\n"
            << "  secret  " << key.string() << "  (mode 0600; keep it secret)\n";
  return exit_ok;
}

}  // namespace cubridge::tool
