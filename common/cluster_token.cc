#include "common/cluster_token.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <ios>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/constant_time.h"

namespace flotilla {
namespace {

constexpr size_t kMaxTokenBytes = 4096;
constexpr size_t kNewTokenBytes = 32;

}  // namespace

absl::StatusOr<std::string> ReadClusterTokenFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the cluster token file ", path));
  // Read no more than a token can be, whatever the file holds.
  std::string head(kMaxTokenBytes + 2, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  const std::string token(absl::StripAsciiWhitespace(head.substr(0, head.find('\n'))));
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("the cluster token file ", path, " is empty"));
  }
  if (token.size() > kMaxTokenBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the cluster token in ", path, " is longer than ", kMaxTokenBytes, " bytes"));
  }
  return token;
}

absl::StatusOr<std::string> NewClusterToken() {
  const int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::InternalError("cannot open /dev/urandom");
  std::string bytes(kNewTokenBytes, '\0');
  size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t n = read(fd, bytes.data() + got, bytes.size() - got);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      close(fd);
      return absl::InternalError("cannot read /dev/urandom");
    }
    got += static_cast<size_t>(n);
  }
  close(fd);
  return absl::BytesToHexString(bytes);
}

absl::Status WriteClusterTokenFile(const std::string& path, const std::string& token) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("cannot create the cluster token file ", path, ": ", std::strerror(errno)));
  }
  const std::string line = token + "\n";
  const bool ok = write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  close(fd);
  if (!ok) return absl::InternalError(absl::StrCat("cannot write the cluster token file ", path));
  return absl::OkStatus();
}

bool TokensEqual(std::string_view presented, std::string_view expected) {
  return !expected.empty() && ConstantTimeEquals(presented, expected);
}

}  // namespace flotilla
