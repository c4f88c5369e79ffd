// Bounded BASP scribes on given sockets, plain or TLS (tls_scribe.hpp): CAF's stream with a
// read/write policy (plain TCP, or CAF's openssl session: TLS 1.3, mutual certificates, as
// CAF's own TLS connections), a bound on each read CAF asks for, and a stream that turns a
// failed allocation into a closed connection.
#include "tls_scribe.hpp"

#include <hyflow/cluster/node_info.hpp>

#include <caf/io/middleman.hpp>
#include <caf/io/network/default_multiplexer.hpp>
#include <caf/io/network/native_socket.hpp>
#include <caf/io/network/stream.hpp>
#include <caf/openssl/session.hpp>
#include <caf/policy/tcp.hpp>

#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <new>
#include <utility>

namespace hyflow::cluster::detail {
namespace {

namespace net = caf::io::network;

/// Every read and write goes through the TLS session.
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

/// `Inner`'s reads, until the connection is condemned: then every read fails, which makes CAF's
/// stream report the connection closed to its broker (the BASP broker cleans up as for a peer
/// that hung up) without reading another byte.
template <class Inner>
class GuardedPolicy {
 public:
  template <class... Ts>
  explicit GuardedPolicy(const bool* condemned, Ts&&... xs) : condemned_(condemned), inner_(std::forward<Ts>(xs)...) {}
  net::rw_state read_some(size_t& result, net::native_socket fd, void* buf, size_t len) {
    result = 0;
    if (*condemned_) return net::rw_state::failure;
    return inner_.read_some(result, fd, buf, len);
  }
  net::rw_state write_some(size_t& result, net::native_socket fd, const void* buf, size_t len) {
    return inner_.write_some(result, fd, buf, len);
  }
  bool must_read_more(net::native_socket fd, size_t threshold) {
    return *condemned_ || inner_.must_read_more(fd, threshold);
  }

 private:
  const bool* condemned_;
  Inner inner_;
};

/// CAF's stream with `Policy`, whose event handling survives a failed allocation (the read
/// buffer CAF sizes to the announced message): the connection is closed instead of the process.
template <class Policy>
class GuardedStream : public net::stream {
 public:
  template <class... Ts>
  GuardedStream(net::default_multiplexer& mx, net::native_socket fd, caf::io::scribe* owner, Ts&&... xs)
      : stream(mx, fd), owner_(owner), policy_(std::forward<Ts>(xs)...) {}

  void handle_event(net::operation op) override {
    try {
      handle_event_impl(op, policy_);
    } catch (const std::bad_alloc&) {
      on_bad_alloc();
    }
  }

  /// Called with the connection's peer when an allocation failed.
  std::function<void()> on_bad_alloc;

  void fail() {
    owner_->io_failure(&backend(), net::operation::read);
    passivate();
  }

 private:
  caf::io::scribe* owner_;
  Policy policy_;
};

template <class Policy>
class BoundedScribe : public caf::io::scribe {
 public:
  template <class... Ts>
  BoundedScribe(net::default_multiplexer& mx, net::native_socket fd, uint64_t max_message_bytes, Ts&&... xs)
      : scribe(net::conn_hdl_from_socket(fd)),
        max_(max_message_bytes),
        stream_(mx, fd, this, &condemned_, std::forward<Ts>(xs)...) {
    stream_.on_bad_alloc = [this] {
      cluster_log("cannot allocate " + std::to_string(asked_) + " bytes for a CAF message from " + peer() +
                  " (out of memory): connection closed");
      condemned_ = true;
      stream_.fail();
    };
  }

  void configure_read(caf::io::receive_policy::config config) override {
    if (config.second > max_) {
      // The peer announced a message larger than allowed: read nothing more. The next read
      // fails (GuardedPolicy), and shutting the socket for reading makes sure one comes.
      cluster_log("a CAF message from " + peer() + " announces " + std::to_string(config.second) +
                  " bytes, more than the limit of " + std::to_string(max_) +
                  " (max_message_bytes; caf-node --max-message-mb): connection closed");
      condemned_ = true;
      ::shutdown(stream_.fd(), SHUT_RD);
      config = caf::io::receive_policy::exactly(1);
    }
    asked_ = config.second;
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
  std::string peer() const { return addr() + ":" + std::to_string(port()); }
  void launch() {
    launched_ = true;
    stream_.start(this);
  }
  bool launched_ = false;
  bool condemned_ = false;
  uint64_t max_;
  size_t asked_ = 0;
  GuardedStream<GuardedPolicy<Policy>> stream_;
};

}  // namespace

caf::io::scribe_ptr make_basp_scribe(caf::actor_system& sys, int fd, bool accepted, bool tls,
                                     uint64_t max_message_bytes) {
  auto& mx = static_cast<net::default_multiplexer&>(sys.middleman().backend());
  if (!tls) return caf::make_counted<BoundedScribe<caf::policy::tcp>>(mx, fd, max_message_bytes);
  auto session = caf::openssl::make_session(sys, fd, accepted);
  if (!session) {
    ::close(fd);
    throw ClusterError(std::string("cannot start a TLS session (") + (accepted ? "accepting" : "connecting") +
                       "): check the certificate, key and CA files");
  }
  return caf::make_counted<BoundedScribe<TlsPolicy>>(mx, fd, max_message_bytes, std::move(session));
}

}  // namespace hyflow::cluster::detail
