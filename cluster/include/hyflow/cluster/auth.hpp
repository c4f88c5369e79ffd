#pragma once
// Node access control: a shared secret and an HMAC challenge-response, run by the node's front
// door on the raw TCP connection before CAF sees it (cluster/src/front_door.hpp): both sides
// send a random 256-bit nonce and prove the secret with HMAC-SHA256 over both, so the secret
// never crosses the network. Until a peer has proven it, the node runs nothing for it.

#include <string>

namespace hyflow::cluster {

/// The shared secret in a file (trailing newline stripped); ValueError when missing or empty.
std::string read_secret_file(const std::string& path);
/// HMAC-SHA256(secret, challenge) in hex: the proof a controller sends.
std::string challenge_proof(const std::string& secret, const std::string& challenge);

}  // namespace hyflow::cluster
