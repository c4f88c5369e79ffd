// TLS scribes on given sockets (tls_scribe.hpp): CAF's stream with a read/write policy that goes
// through CAF's openssl session (TLS 1.3, mutual certificates, as CAF's own TLS connections).
#include "tls_scribe.hpp"

#include <hyflow/cluster/node_info.hpp>

#include <caf/io/middleman.hpp>
#include <caf/io/network/default_multiplexer.hpp>
#include <caf/io/network/native_socket.hpp>
#include <caf/io/network/stream_impl.hpp>
#include <caf/openssl/session.hpp>

#include <unistd.h>

namespace hyflow::cluster::detail {
namespace {

namespace net = caf::io::network;

/// The stream's I/O policy: every read and write goes through the TLS session.
class TlsPolicy {
 public:
  explicit TlsPolicy(caf::openssl::session_ptr session) : session_(std::move(session)) {}
  net::rw_state read_some(size_t& result, net::native_socket fd, void* buf, size_t len) {
    return session_->read_some(result, fd, buf, len);
  }
  net::rw_state write_some(size_t& result, net::native_socket fd, const void* buf, size_t len) {
    return session_->write_some(result, fd, buf, len);
  }
  bool must_read_more(net::native_socket fd, size_t threshold) { return session_->must_read_more(fd, threshold); }

 private:
  caf::openssl::session_ptr session_;
};

class TlsScribe : public caf::io::scribe {
 public:
  TlsScribe(net::default_multiplexer& mx, net::native_socket fd, caf::openssl::session_ptr session)
      : scribe(net::conn_hdl_from_socket(fd)), stream_(mx, fd, std::move(session)) {}

  void configure_read(caf::io::receive_policy::config config) override {
    stream_.configure_read(config);
    if (!launched_) launch();
  }
  void ack_writes(bool enable) override { stream_.ack_writes(enable); }
  std::vector<char>& wr_buf() override { return stream_.wr_buf(); }
  std::vector<char>& rd_buf() override { return stream_.rd_buf(); }
  void graceful_shutdown() override {
    stream_.graceful_shutdown();
    detach(&stream_.backend(), false);
  }
  void flush() override { stream_.flush(this); }
  std::string addr() const override {
    auto x = net::remote_addr_of_fd(stream_.fd());
    return x ? *x : std::string();
  }
  uint16_t port() const override {
    auto x = net::remote_port_of_fd(stream_.fd());
    return x ? *x : uint16_t{0};
  }
  void add_to_loop() override { stream_.activate(this); }
  void remove_from_loop() override { stream_.passivate(); }

 private:
  void launch() {
    launched_ = true;
    stream_.start(this);
  }
  bool launched_ = false;
  net::stream_impl<TlsPolicy> stream_;
};

}  // namespace

caf::io::scribe_ptr make_tls_scribe(caf::actor_system& sys, int fd, bool accepted) {
  auto session = caf::openssl::make_session(sys, fd, accepted);
  if (!session) {
    ::close(fd);
    throw ClusterError(std::string("cannot start a TLS session (") + (accepted ? "accepting" : "connecting") +
                       "): check the certificate, key and CA files");
  }
  auto& mx = static_cast<net::default_multiplexer&>(sys.middleman().backend());
  return caf::make_counted<TlsScribe>(mx, fd, std::move(session));
}

}  // namespace hyflow::cluster::detail
