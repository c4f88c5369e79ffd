#include <hyflow/serve/api_error.hpp>

namespace hyflow::serve {

ApiError bad_request(const std::string& param, const std::string& message) {
  return ApiError(400, "invalid_request_error", param, message);
}

nlohmann::json error_body(int status, const std::string& type, const std::string& param, const std::string& message) {
  return {{"error",
           {{"message", message},
            {"type", type},
            {"param", param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param)},
            {"code", status}}}};
}

nlohmann::json error_body(const ApiError& error) {
  return error_body(error.status(), error.type(), error.param(), error.what());
}

}  // namespace hyflow::serve
