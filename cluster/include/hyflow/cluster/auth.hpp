#pragma once
// Node access control: a shared secret and an HMAC challenge-response. A node sends a random
// 256-bit challenge; the controller answers HMAC-SHA256(secret, challenge), so the secret never
// crosses the network. Until a session has answered, the node runs nothing for it.

#include <string>

namespace hyflow::cluster {

/// The shared secret in a file (trailing newline stripped); ValueError when missing or empty.
std::string read_secret_file(const std::string& path);
/// HMAC-SHA256(secret, challenge) in hex: the proof a controller sends.
std::string challenge_proof(const std::string& secret, const std::string& challenge);

}  // namespace hyflow::cluster
