#pragma once
// Self-made certificates for the TLS tests, made with the openssl CLI in a fresh temporary
// directory (removed again): a CA, a node and a controller certificate it signed, and a
// "rogue" certificate signed by another CA. Throws when the openssl CLI is missing (it is a
// test dependency: scripts/install-deps.sh installs it), so a test fails instead of skipping.

#include <hyflow/cluster/tls.hpp>

#include <hyflow/cluster/all.hpp>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace test {

using TlsFiles = hyflow::cluster::TlsFiles;

class TlsCertificates {
 public:
  TlsCertificates() {
    if (std::system("openssl version > /dev/null 2>&1") != 0)
      throw std::runtime_error("the openssl command-line tool is needed to make test certificates "
                               "(scripts/install-deps.sh installs the 'openssl' package)");
    std::string tmpl = (std::filesystem::temp_directory_path() / "hyflow-tls-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed for " + tmpl);
    dir_ = tmpl;
    make_ca("ca", "hyflow-test-ca");
    make_signed("node", "ca", "hyflow-node");
    make_signed("controller", "ca", "hyflow-controller");
    make_ca("other-ca", "another-ca");
    make_signed("rogue", "other-ca", "rogue-controller");
  }
  ~TlsCertificates() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  TlsCertificates(const TlsCertificates&) = delete;
  TlsCertificates& operator=(const TlsCertificates&) = delete;

  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  /// A certificate of `name` signed by `ca_of_peer`'s CA is trusted when the peer's CA file
  /// is `ca_file`.
  TlsFiles files(const std::string& name, const std::string& ca_file = "ca") const {
    return {path(name + ".pem"), path(name + ".key"), path(ca_file + ".pem")};
  }
  std::vector<std::string> node_flags(const std::string& name = "node") const {
    auto f = files(name);
    return {"--tls-cert=" + f.cert, "--tls-key=" + f.key, "--tls-ca=" + f.ca};
  }

 private:
  void run(const std::string& cmd) const {
    const std::string full = "cd '" + dir_ + "' && " + cmd + " > /dev/null 2>&1";
    if (std::system(full.c_str()) != 0) throw std::runtime_error("making test certificates failed: " + cmd);
  }
  void make_ca(const std::string& name, const std::string& cn) const {
    run("openssl req -x509 -newkey rsa:2048 -nodes -keyout " + name + ".key -out " + name +
        ".pem -days 2 -subj /CN=" + cn);
  }
  void make_signed(const std::string& name, const std::string& ca, const std::string& cn) const {
    run("openssl req -newkey rsa:2048 -nodes -keyout " + name + ".key -out " + name + ".csr -subj /CN=" + cn);
    run("openssl x509 -req -in " + name + ".csr -CA " + ca + ".pem -CAkey " + ca + ".key -CAcreateserial -out " + name +
        ".pem -days 2");
  }
  std::string dir_;
};

}  // namespace test
