#pragma once
// Mutual TLS between controllers and caf-nodes (CAF's openssl module): each side has a PEM
// certificate, its private key and the CA that signed the other side's certificates.

#include <hyflow/actors/runtime.hpp>

#include <string>
#include <vector>

namespace hyflow::cluster {

/// A TLS file set: all three or none.
struct TlsFiles {
  std::string cert;  ///< this side's certificate (PEM)
  std::string key;   ///< its unencrypted private key (PEM)
  std::string ca;    ///< the CA that signed the peers' certificates (PEM)

  bool empty() const { return cert.empty() && key.empty() && ca.empty(); }
  bool operator==(const TlsFiles&) const = default;
};

/// Checks a file set before CAF's openssl module sees it (CAF aborts a server and hangs a
/// client on a bad path). A partial set is a ValueError naming the missing one as `names`
/// spell them (e.g. {"--tls-cert", "--tls-key", "--tls-ca"}); each file must be readable PEM
/// of its kind (certificate, private key, CA certificate) and the key must belong to the
/// certificate, else a ValueError naming the file. True when TLS is on (the set is complete).
bool check_tls_files(const TlsFiles& files, const std::vector<std::string>& names = {"tls_cert", "tls_key", "tls_ca"});

/// `options` whose actor system loads CAF's openssl module with `files` (checked first with
/// check_tls_files). An empty set returns `options` unchanged; a set without
/// `options.network` is a ValueError. Give the RemoteLauncher (ClusterOptions::tls) the same
/// files.
RuntimeOptions with_tls(RuntimeOptions options, const TlsFiles& files,
                        const std::vector<std::string>& names = {"tls_cert", "tls_key", "tls_ca"});

}  // namespace hyflow::cluster
