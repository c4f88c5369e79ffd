// Checking a mutual-TLS file set, and loading CAF's openssl module with it.
#include <hyflow/cluster/tls.hpp>

#include "detail.hpp"

#include <caf/io/middleman.hpp>
#include <caf/openssl/manager.hpp>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

namespace hyflow::cluster {
namespace {

std::string openssl_reason() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "no PEM data";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  return buf;
}

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};

std::unique_ptr<FILE, FileCloser> open_pem(const std::string& path, const std::string& what) {
  std::unique_ptr<FILE, FileCloser> f(std::fopen(path.c_str(), "rb"));
  if (!f) throw ValueError("TLS " + what + " file '" + path + "' cannot be read: " + std::strerror(errno));
  return f;
}

std::unique_ptr<X509, decltype(&X509_free)> read_certificate(const std::string& path, const std::string& what) {
  auto f = open_pem(path, what);
  ERR_clear_error();
  std::unique_ptr<X509, decltype(&X509_free)> cert(PEM_read_X509(f.get(), nullptr, nullptr, nullptr), &X509_free);
  if (!cert)
    throw ValueError("TLS " + what + " file '" + path + "' holds no PEM certificate (" + openssl_reason() + ")");
  return cert;
}

}  // namespace

bool check_tls_files(const TlsFiles& tls, const std::vector<std::string>& names) {
  const std::string& cert = tls.cert;
  const std::string& key = tls.key;
  const std::string& ca = tls.ca;
  const std::string* files[3] = {&cert, &key, &ca};
  std::string missing, given;
  for (size_t i = 0; i < 3; ++i) {
    const std::string name = i < names.size() ? names[i] : "TLS file " + std::to_string(i + 1);
    std::string& list = files[i]->empty() ? missing : given;
    list += (list.empty() ? "" : ", ") + name;
  }
  if (given.empty()) return false;
  if (!missing.empty())
    throw ValueError("mutual TLS needs a certificate, its key and a CA file together: " + given + " given, " + missing +
                     " missing");
  auto certificate = read_certificate(cert, "certificate");
  read_certificate(ca, "CA");
  auto f = open_pem(key, "key");
  ERR_clear_error();
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> pkey(PEM_read_PrivateKey(f.get(), nullptr, nullptr, nullptr),
                                                           &EVP_PKEY_free);
  if (!pkey)
    throw ValueError("TLS key file '" + key + "' holds no unencrypted PEM private key (" + openssl_reason() + ")");
  if (X509_check_private_key(certificate.get(), pkey.get()) != 1) {
    ERR_clear_error();
    throw ValueError("TLS key file '" + key + "' does not belong to the certificate '" + cert + "'");
  }
  return true;
}

namespace detail {

void configure_tls(caf::actor_system_config& cfg, const TlsFiles& files) {
  cfg.load<caf::openssl::manager>();  // needs the middleman, loaded before
  cfg.openssl_certificate = files.cert;
  cfg.openssl_key = files.key;
  cfg.openssl_cafile = files.ca;
}

}  // namespace detail

RuntimeOptions with_tls(RuntimeOptions options, const TlsFiles& files, const std::vector<std::string>& names) {
  if (!check_tls_files(files, names)) return options;  // CAF aborts or hangs on a bad file: check first
  if (!options.network) throw ValueError("RuntimeOptions: TLS files given without network = true");
  options.configure_system = [files, before = std::move(options.configure_system)](caf::actor_system_config& cfg) {
    if (before) before(cfg);
    detail::configure_tls(cfg, files);
  };
  return options;
}

}  // namespace hyflow::cluster
