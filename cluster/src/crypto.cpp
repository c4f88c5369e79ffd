// HMAC-SHA256, constant-time comparison, random bytes and hex of the cluster module (crypto.hpp).
#include "crypto.hpp"

#include <hyflow/cluster/node_info.hpp>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

namespace hyflow::cluster::crypto {

Bytes32 hmac_sha256(std::string_view key, std::string_view message) {
  Bytes32 out{};
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
            reinterpret_cast<const unsigned char*>(message.data()), message.size(), out.data(), &len) ||
      len != out.size())
    throw ClusterError("HMAC-SHA256 failed");
  return out;
}

bool equal_in_constant_time(const void* a, const void* b, size_t n) { return CRYPTO_memcmp(a, b, n) == 0; }

void random_bytes(void* out, size_t n, const std::string& what) {
  if (RAND_bytes(static_cast<unsigned char*>(out), static_cast<int>(n)) != 1)
    throw ClusterError("cannot draw " + what + " (RAND_bytes failed)");
}

Bytes32 random32(const std::string& what) {
  Bytes32 b{};
  random_bytes(b.data(), b.size(), what);
  return b;
}

std::string to_hex(const void* data, size_t n) {
  static constexpr char digits[] = "0123456789abcdef";
  const auto* p = static_cast<const unsigned char*>(data);
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = digits[p[i] >> 4];
    out[2 * i + 1] = digits[p[i] & 15];
  }
  return out;
}

bool from_hex(std::string_view hex, void* out, size_t n) {
  if (hex.size() != 2 * n) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  auto* bytes = static_cast<unsigned char*>(out);
  for (size_t i = 0; i < n; ++i) {
    const int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    bytes[i] = static_cast<unsigned char>(hi * 16 + lo);
  }
  return true;
}

}  // namespace hyflow::cluster::crypto
