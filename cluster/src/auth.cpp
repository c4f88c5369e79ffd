// The shared secret and the HMAC challenge-response of node access control.
#include <hyflow/cluster/auth.hpp>

#include "detail.hpp"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <fstream>
#include <iomanip>
#include <sstream>

namespace hyflow::cluster {
namespace detail {

std::string to_hex(const unsigned char* p, size_t n) {
  std::ostringstream os;
  for (size_t i = 0; i < n; ++i) os << std::hex << std::setw(2) << std::setfill('0') << int(p[i]);
  return os.str();
}

}  // namespace detail

std::string read_secret_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ValueError("secret file '" + path + "' cannot be read");
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  if (s.empty()) throw ValueError("secret file '" + path + "' is empty");
  return s;
}

std::string challenge_proof(const std::string& secret, const std::string& challenge) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
            reinterpret_cast<const unsigned char*>(challenge.data()), challenge.size(), md, &len))
    throw ClusterError("HMAC-SHA256 failed");
  return detail::to_hex(md, len);
}

}  // namespace hyflow::cluster
