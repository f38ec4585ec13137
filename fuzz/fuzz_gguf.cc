// The GGUF reader on arbitrary files: Open() must accept or refuse with a
// status, never crash or read outside the file; what it accepts must be
// usable (every tensor found by name inside the file, the tokenizer built or
// refused cleanly).
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "engine/model/gguf_file.h"
#include "engine/tokenizer/bpe_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using tandem::model::GgufFile;
  const int fd = memfd_create("gguf-fuzz", 0);
  if (fd < 0) std::abort();
  for (size_t done = 0; done < size;) {
    const ssize_t n = write(fd, data + done, size - done);
    if (n <= 0) std::abort();
    done += static_cast<size_t>(n);
  }
  auto file = GgufFile::Open("/proc/self/fd/" + std::to_string(fd));
  if (file.ok()) {
    const GgufFile& f = **file;
    for (const auto& t : f.tensors()) {
      if (f.FindTensor(t.name) == nullptr) std::abort();
      volatile uint8_t sink = 0;
      if (t.bytes > 0) sink = sink + t.data[0] + t.data[t.bytes - 1];  // inside the map
    }
    (void)tandem::tokenizer::BpeTokenizer::FromGguf(f);
  }
  close(fd);
  return 0;
}
