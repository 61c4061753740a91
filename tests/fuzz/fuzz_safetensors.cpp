// libFuzzer target: the whole safetensors parser (length prefix, JSON header,
// every validation) over arbitrary bytes, exactly as the mmap reader calls it.
// Any exception other than checkpoint_error, any crash, any sanitizer report
// and any tensor view outside the input is a finding.
//   CC=clang CXX=clang++ cmake -B build-fuzz -G Ninja -DRLSYNC_FUZZ=ON -DRLSYNC_WITH_CUDA=OFF
//   ninja -C build-fuzz fuzz_safetensors
//   build-fuzz/tests/fuzz_safetensors -max_total_time=180 CORPUS_DIR tests/data/bad_safetensors
#include "runtime/checkpoint/safetensors.hpp"

#include <cstdint>
#include <cstdlib>
#include <cstring>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    auto layout = rlsync::parse_safetensors(data, size, "fuzz");
    const auto* begin = reinterpret_cast<const std::byte*>(data);
    std::uint64_t covered = 0;
    for (auto& t : layout.tensors) {
      if (t.data < begin || t.size > size || t.data + t.size > begin + size)
        std::abort();
      if (t.size != t.bytes())
        std::abort();
      covered += t.size;
      if (t.size > 0) { // let ASan see a read of both ends
        volatile std::byte first = t.data[0], last = t.data[t.size - 1];
        (void)first;
        (void)last;
      }
    }
    if (covered != size - 8 - layout.header_size) // tensors tile the data exactly
      std::abort();
  } catch (const rlsync::checkpoint_error& e) {
    if (std::strlen(e.what()) <= std::strlen("fuzz: "))
      std::abort(); // every rejection says why
  }
  return 0;
}
