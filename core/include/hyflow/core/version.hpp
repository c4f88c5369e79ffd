#pragma once
// The hyflow build a program runs: the project version and the git commit of the source tree,
// both taken when CMake configured the build (core/CMakeLists.txt).

namespace hyflow {

/// The project version of CMake's project(VERSION), "0.1.0".
const char* version();
/// `git rev-parse --short HEAD` of the source tree when the build was configured, with "-dirty"
/// when tracked files were modified; "unknown" when the tree is not a git checkout (a tarball) or
/// git is missing.
const char* git_commit();

}  // namespace hyflow
