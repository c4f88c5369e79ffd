#pragma once
// The exception hierarchy shared by every hyflow module. Messages name the thing that was
// wrong: the key, the sizes, the file and byte offset.

#include <stdexcept>
#include <string>

namespace hyflow {

/// Base of every error hyflow throws on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Tensors or columns whose sizes do not fit together (batch sizes, chunk counts, shapes).
class ShapeError : public Error {
 public:
  using Error::Error;
};

/// A key that is missing, or present where it must not be.
class KeyError : public Error {
 public:
  using Error::Error;
};

/// A value that is well-formed but not allowed (a conflicting union, a bad argument).
class ValueError : public Error {
 public:
  using Error::Error;
};

/// Bytes or files that do not follow their format: truncated, corrupt or hostile input.
class FormatError : public Error {
 public:
  using Error::Error;
};

}  // namespace hyflow
