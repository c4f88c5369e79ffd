// The shared secret and the HMAC challenge-response of node access control.
#include <hyflow/cluster/auth.hpp>
#include <hyflow/cluster/node_info.hpp>

#include "crypto.hpp"

#include <fstream>
#include <iterator>

namespace hyflow::cluster {

std::string read_secret_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ValueError("secret file '" + path + "' cannot be read");
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  if (s.empty()) throw ValueError("secret file '" + path + "' is empty");
  return s;
}

std::string challenge_proof(const std::string& secret, const std::string& challenge) {
  const crypto::Bytes32 proof = crypto::hmac_sha256(secret, challenge);
  return crypto::to_hex(proof.data(), proof.size());
}

}  // namespace hyflow::cluster
