// Free loopback ports for launched daemons (common/free_port.h): drawn ports
// are bindable and reserved across processes, so two launchers never get the
// same one before a daemon binds it; a lapsed reservation is taken over.
#include "common/free_port.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <utime.h>

#include <filesystem>
#include <set>
#include <string>

namespace tandem {
namespace {

class FreePortTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/free_port_test_" + std::to_string(::getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    const char* old = std::getenv("TMPDIR");
    old_tmpdir_ = old != nullptr ? old : "";
    had_tmpdir_ = old != nullptr;
    ::setenv("TMPDIR", dir_.c_str(), 1);
  }
  void TearDown() override {
    if (had_tmpdir_) {
      ::setenv("TMPDIR", old_tmpdir_.c_str(), 1);
    } else {
      ::unsetenv("TMPDIR");
    }
    std::filesystem::remove_all(dir_);
  }
  std::string Reservation(int port) const {
    return dir_ + "/tandem-port-reservations/" + std::to_string(port);
  }

  std::string dir_, old_tmpdir_;
  bool had_tmpdir_ = false;
};

TEST_F(FreePortTest, DrawnPortsAreBindableReservedAndNeverDrawnTwice) {
  std::set<int> ports;
  for (int i = 0; i < 50; ++i) {
    int port = FreeLoopbackPort();
    ASSERT_GT(port, 0);
    EXPECT_TRUE(ports.insert(port).second) << "port " << port << " drawn twice";
    EXPECT_TRUE(std::filesystem::exists(Reservation(port)));
    // Another launcher cannot reserve it now.
    EXPECT_FALSE(free_port_internal::Reserve(port));
    int bind = port;
    EXPECT_TRUE(free_port_internal::Bindable(bind));
  }
}

TEST_F(FreePortTest, ALapsedReservationIsTakenOver) {
  const int port = FreeLoopbackPort();
  ASSERT_GT(port, 0);
  ASSERT_FALSE(free_port_internal::Reserve(port));
  const time_t old = std::time(nullptr) - free_port_internal::kReservationSeconds - 5;
  const utimbuf times{old, old};
  ASSERT_EQ(::utime(Reservation(port).c_str(), &times), 0);
  EXPECT_TRUE(free_port_internal::Reserve(port));
  EXPECT_FALSE(free_port_internal::Reserve(port)) << "and it is reserved again";
}

}  // namespace
}  // namespace tandem
