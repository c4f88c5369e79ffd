#pragma once
// hyflow::cluster: caf-node processes, their access control (shared secret, mutual TLS), the
// controller's RemoteLauncher and the data plane for large DataProtos.
#include <hyflow/cluster/auth.hpp>
#include <hyflow/cluster/data_plane.hpp>
#include <hyflow/cluster/node_info.hpp>
#include <hyflow/cluster/node_metrics.hpp>
#include <hyflow/cluster/node_server.hpp>
#include <hyflow/cluster/remote_launcher.hpp>
#include <hyflow/cluster/tls.hpp>
