#pragma once
// Internal to the cluster module: a CAF connection (BASP scribe) over TLS on a socket that is
// already connected and has passed the front door (front_door.hpp). CAF's openssl module only
// makes TLS connections it opened or accepted itself; this one wraps a given socket with CAF's
// openssl session, so a TLS node also runs the secret check before any CAF byte is read.

#include <caf/actor_system.hpp>
#include <caf/io/scribe.hpp>

namespace hyflow::cluster::detail {

/// A scribe speaking TLS on `fd` (its owner from now on). `accepted`: this side is the server
/// (the node). Certificates come from the actor system's openssl configuration (with_tls,
/// configure_tls). ClusterError when the TLS session cannot be set up.
caf::io::scribe_ptr make_tls_scribe(caf::actor_system& sys, int fd, bool accepted);

}  // namespace hyflow::cluster::detail
