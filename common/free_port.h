// A TCP port on 127.0.0.1 for a daemon that a test or `tandem bench` starts.
//
// The port is free when returned and the daemon binds it a moment later, so
// nothing else may take it in between. A port the kernel picks for a bind to
// port 0 comes from the ephemeral range, which is also where every outgoing
// connection's source port comes from: with tests running side by side
// (clients opening connections by the hundred), one of them took such a port
// before the daemon could bind it. So the port is drawn at random from below
// the ephemeral range instead, where the kernel hands out nothing by itself,
// and checked by binding it.
//
// Two launchers side by side could still draw the same free port while
// neither daemon has bound it yet (a daemon binds after loading its model,
// seconds later under a sanitizer). So a drawn port is also reserved, across
// processes, by creating the file $TMPDIR/tandem-port-reservations/PORT
// exclusively; a reservation lapses after kReservationSeconds (by then the
// daemon has bound the port, or never will). The Python tests' free_port()
// (tests/e2e/python/tandem_e2e.py) reserves in the same directory.
#ifndef TANDEM_COMMON_FREE_PORT_H_
#define TANDEM_COMMON_FREE_PORT_H_

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <ctime>
#include <fstream>
#include <random>
#include <string>

namespace tandem {

namespace free_port_internal {

// Whether 127.0.0.1:`port` can be bound now (0: the kernel picks; `port` is
// then set to what it picked).
inline bool Bindable(int& port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof(addr);
  const bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                     ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  if (bound) port = ntohs(addr.sin_port);
  ::close(fd);
  return bound;
}

inline constexpr int kReservationSeconds = 300;

// Reserves `port` for this caller: false when another launcher reserved it
// less than kReservationSeconds ago. (A directory that cannot be made
// reserves nothing, and every port passes.)
inline bool Reserve(int port) {
  const char* tmp = std::getenv("TMPDIR");
  const std::string dir =
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/tandem-port-reservations";
  ::mkdir(dir.c_str(), 0777);
  const std::string path = dir + "/" + std::to_string(port);
  for (int attempt = 0; attempt < 2; ++attempt) {
    const int fd = ::open(path.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0666);
    if (fd >= 0) {
      ::close(fd);
      return true;
    }
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return true;  // cannot reserve here: no reservations
    if (std::time(nullptr) - st.st_mtime < kReservationSeconds) return false;
    ::unlink(path.c_str());  // lapsed: take it over
  }
  return false;
}

}  // namespace free_port_internal

// A port of 127.0.0.1 that is free now, below the ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range) and not below 10000; where that
// range leaves no room, one the kernel picks. 0 if none could be found.
inline int FreeLoopbackPort() {
  int ephemeral_low = 32768;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> ephemeral_low;
  constexpr int kLowest = 10000;
  if (ephemeral_low - kLowest >= 1000) {
    std::random_device seed;
    std::mt19937 random(seed());
    std::uniform_int_distribution<int> pick(kLowest, ephemeral_low - 1);
    for (int attempt = 0; attempt < 200; ++attempt) {
      int port = pick(random);
      if (free_port_internal::Bindable(port) && free_port_internal::Reserve(port)) return port;
    }
  }
  int port = 0;
  return free_port_internal::Bindable(port) ? port : 0;
}

}  // namespace tandem

#endif  // TANDEM_COMMON_FREE_PORT_H_
