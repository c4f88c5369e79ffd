#pragma once
// A tiny HTTP client for the metrics tests: sends raw bytes to 127.0.0.1:port and reads the
// answer until the server closes (or the timeout passes).

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <stdexcept>
#include <string>

namespace metrics_test {

inline int connect_local(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    throw std::runtime_error("cannot connect to 127.0.0.1:" + std::to_string(port));
  }
  return fd;
}

/// Everything the server sends until it closes; "" when it closes without a byte.
inline std::string read_until_close(int fd, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  std::string out;
  const auto end = std::chrono::steady_clock::now() + timeout;
  char buf[4096];
  while (std::chrono::steady_clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return out;
    out.append(buf, static_cast<size_t>(n));
  }
  throw std::runtime_error("the server did not close the connection in time");
}

/// Sends `request` and returns the whole response.
inline std::string exchange(int port, const std::string& request) {
  int fd = connect_local(port);
  (void)!::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string response = read_until_close(fd);
  ::close(fd);
  return response;
}

inline std::string get(int port, const std::string& path = "/metrics", const std::string& headers = "") {
  return exchange(port, "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" + headers + "\r\n");
}

/// The status code of a response ("HTTP/1.1 200 OK" -> 200); 0 when there is none.
inline int status_of(const std::string& response) {
  if (response.rfind("HTTP/1.1 ", 0) != 0 || response.size() < 12) return 0;
  return std::stoi(response.substr(9, 3));
}

inline std::string body_of(const std::string& response) {
  const auto end = response.find("\r\n\r\n");
  return end == std::string::npos ? "" : response.substr(end + 4);
}

}  // namespace metrics_test
