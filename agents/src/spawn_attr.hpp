#pragma once
// posix_spawn attributes shared by the sandbox and the black-box agent runner: the child leads a
// process group of its own (so that killpg reaches whatever it starts) and begins with every
// signal at its default action and none blocked, whatever the parent's threads had set.

#include <signal.h>
#include <spawn.h>

namespace hyflow::agents::detail {

/// Initializes `attr` (posix_spawnattr_init) for a child in a new process group with default
/// signal dispositions and an empty signal mask; the caller destroys it.
inline void init_group_spawn_attr(posix_spawnattr_t& attr) {
  posix_spawnattr_init(&attr);
  sigset_t all, none;
  sigfillset(&all);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
}

}  // namespace hyflow::agents::detail
