#pragma once
// An error the user can cause and fix (bad config, missing data, impossible budget). The message
// names the file, key or argument, the bad value and what would work; the program prints it as
// one line and exits with status 2. Programming errors are assertions, not UserErrors.

#include <stdexcept>
#include <string>

namespace ht {

class UserError : public std::runtime_error {
 public:
  explicit UserError(const std::string& message) : std::runtime_error(message) {}
};

constexpr int kUserErrorExitCode = 2;

}  // namespace ht
