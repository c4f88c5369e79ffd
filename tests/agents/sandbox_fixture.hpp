#pragma once
// The sandbox of the agents tests: bwrap is required under CI=true (scripts/install-deps.sh
// installs it); elsewhere a machine without it, or whose kernel refuses bwrap its namespaces,
// skips the sandbox tests with a warning.
#include <hyflow/agents/sandbox.hpp>

#include <catch2/catch.hpp>

#include <cstdlib>
#include <optional>
#include <string>

namespace hyflow::agents::testing {

/// A sandbox that was seen to start a program (bwrap present and allowed to make its namespaces).
inline std::optional<Sandbox> sandbox_or_skip() {
  try {
    Sandbox sandbox;
    (void)sandbox.run({.argv = {"/usr/bin/true"}}, SandboxLimits{});
    return sandbox;
  } catch (const SandboxUnavailable& e) {
    const char* ci = std::getenv("CI");  // NOLINT(concurrency-mt-unsafe)
    if (ci && std::string(ci) == "true") FAIL("CI=true and the sandbox is unavailable: " << e.what());
    WARN("SKIPPED: " << e.what());
    return std::nullopt;
  }
}

}  // namespace hyflow::agents::testing
