#pragma once
// ApiError: an error a client caused (or must wait out), answered as OpenAI's error object
// {"error": {"message", "type", "param", "code"}} with its HTTP status.

#include <hyflow/core/error.hpp>

#include <nlohmann/json.hpp>

#include <string>

namespace hyflow::serve {

class ApiError : public Error {
 public:
  /// `param` names the request field that was wrong ("" for none).
  ApiError(int status, std::string type, std::string param, const std::string& message)
      : Error(message), status_(status), type_(std::move(type)), param_(std::move(param)) {}
  int status() const { return status_; }
  const std::string& type() const { return type_; }
  const std::string& param() const { return param_; }

 private:
  int status_;
  std::string type_, param_;
};

/// 400 invalid_request_error naming `param`.
ApiError bad_request(const std::string& param, const std::string& message);

/// OpenAI's error object for a status, type, param ("" gives null) and message.
nlohmann::json error_body(int status, const std::string& type, const std::string& param, const std::string& message);
nlohmann::json error_body(const ApiError& error);

}  // namespace hyflow::serve
