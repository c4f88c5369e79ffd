#pragma once
// Internal to the cluster module: the cryptography of node access control and the data plane
// (OpenSSL): HMAC-SHA256, comparisons in constant time, random nonces and ids, hex.

#include <array>
#include <cstddef>
#include <string>
#include <string_view>

namespace hyflow::cluster::crypto {

/// An HMAC-SHA256 digest, or a 256-bit nonce.
using Bytes32 = std::array<unsigned char, 32>;

/// HMAC-SHA256(key, message). ClusterError when OpenSSL fails.
Bytes32 hmac_sha256(std::string_view key, std::string_view message);

/// Whether n bytes at a and b are equal, in a time that does not depend on where they differ.
bool equal_in_constant_time(const void* a, const void* b, size_t n);

/// n bytes from OpenSSL's random generator; ClusterError naming `what` ("a random challenge")
/// when it fails.
void random_bytes(void* out, size_t n, const std::string& what);
/// A 256-bit random nonce (random_bytes).
Bytes32 random32(const std::string& what);

/// Lower-case hex of n bytes.
std::string to_hex(const void* data, size_t n);
/// n bytes from 2n hex digits (either case); false when `hex` is not that.
bool from_hex(std::string_view hex, void* out, size_t n);

}  // namespace hyflow::cluster::crypto
