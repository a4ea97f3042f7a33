#include "update/update_commands.hpp"

#include "exit_codes.hpp"
#include "update/arguments.hpp"

#include <cubridge/core/error.hpp>

#include <iostream>

namespace cubridge::tool {

namespace {
constexpr const char* expires_help =
    "Signed expiry: a duration (30m, 12h, 7d) or an RFC 3339 UTC time (2027-01-31T00:00:00Z)";
constexpr const char* readable_key_help =
    "Sign with a secret key file that group or others may read (refused otherwise)";
}  // namespace

update_commands::update_commands(CLI::App& app) {
  keygen_ = app.add_subcommand("keygen", "Make an Ed25519 key pair for signing module bundles");
  keygen_->add_option("--out", keygen_args_.out, "Writes NAME.pub and NAME.key (mode 0600)")
      ->required();
  keygen_->add_flag("--force", keygen_args_.force, "Replace existing key files");

  sign_ = app.add_subcommand("sign", "Sign a cubin, fatbin or .cu file as a module bundle");
  sign_->add_option("file", sign_args_.file, "The cubin, fatbin or CUDA source (.cu)")->required();
  sign_->add_option("--key", sign_args_.key, "Secret key file (from keygen)")->required();
  sign_->add_option("--name", sign_args_.name, "Module name (default: the file's stem)");
  sign_->add_option("--version", sign_args_.version, "Module version, above the serving one")
      ->required()
      ->check(version_validator());
  sign_->add_option("--target", sign_args_.target,
                    "Target GPU, e.g. sm_90 (default for a cubin: its own architecture)");
  sign_->add_option("-o,--out", sign_args_.out, "Bundle file (default: NAME-vVERSION.bundle)");
  sign_->add_option("--expires", sign_args_.expires, expires_help);
  sign_->add_flag("--allow-readable-key", sign_args_.allow_readable_key, readable_key_help);

  push_ =
      app.add_subcommand("push", "Push a module to a service's update endpoint, or roll one back");
  push_->add_option("url", push_args_.url, "The endpoint, e.g. http://127.0.0.1:7070")->required();
  push_->add_option("file", push_args_.file,
                    "A .bundle (sent as is), or a .cu, cubin or fatbin (signed first)");
  push_->add_option("--key", push_args_.key, "Secret key file: signs a file or the rollback");
  push_->add_option("--name", push_args_.name, "Module name (default: the file's stem)");
  push_->add_option("--version", push_args_.version, "Module version when signing")
      ->check(version_validator());
  push_->add_option("--target", push_args_.target,
                    "GPU to compile a .cu for (default: the endpoint's GPU, from GET /v1/modules)");
  push_->add_option("--rollback", push_args_.rollback, "Roll module NAME back instead of pushing");
  push_->add_option("--ca-cert", push_args_.ca_cert, "CA certificate (PEM) for an https URL");
  push_->add_option("--expires", push_args_.expires, expires_help);
  push_->add_flag("--allow-readable-key", push_args_.allow_readable_key, readable_key_help);
}

bool update_commands::parsed() const {
  return keygen_->parsed() || sign_->parsed() || push_->parsed();
}

int update_commands::run() const noexcept {
  try {
    if (keygen_->parsed()) return keygen();
    if (sign_->parsed()) return sign();
    if (push_->parsed()) return push();
  } catch (const usage_error& e) {
    std::cerr << "cubridge: " << e.what() << "\n";
    return exit_usage;
  } catch (const std::exception& e) {
    std::cerr << "cubridge: " << e.what() << "\n";
    return exit_failure;
  }
  return exit_usage;
}

}  // namespace cubridge::tool
