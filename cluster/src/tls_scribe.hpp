#pragma once
// Internal to the cluster module: CAF connections (BASP scribes) on sockets that are already
// connected and have passed the front door (front_door.hpp), plain or over TLS, with every
// read bounded. CAF's openssl module only makes TLS connections it opened or accepted itself;
// these wrap a given socket with CAF's openssl session, so a TLS node also runs the secret check
// before any CAF byte is read. CAF 0.17's BASP has no cap on a message's size: a 32-byte header
// announcing 4 GiB makes the receiver allocate (and zero) 4 GiB before anything else, and under
// a memory limit the failed allocation (std::bad_alloc on CAF's I/O thread) ends the process.
// These scribes refuse a message larger than `max_message_bytes` and close a connection whose
// buffer cannot be allocated, logging why; the process and its other connections go on.

#include <caf/actor_system.hpp>
#include <caf/io/scribe.hpp>

#include <cstdint>

namespace hyflow::cluster::detail {

/// A scribe on `fd` (its owner from now on), speaking TLS when `tls`. `accepted`: this side is
/// the server (the node). A peer's message announcing more than `max_message_bytes` closes the
/// connection (logged with the peer and both sizes), as does one whose buffer cannot be
/// allocated. TLS certificates come from the actor system's openssl configuration (with_tls,
/// configure_tls). ClusterError when the TLS session cannot be set up.
caf::io::scribe_ptr make_basp_scribe(caf::actor_system& sys, int fd, bool accepted, bool tls,
                                     uint64_t max_message_bytes);

}  // namespace hyflow::cluster::detail
