#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "core/half.h"
#include "engine/cuda/weight_upload.h"

namespace entropyinfer::cuda {
namespace {

// 32 MiB of bf16 per piece and three pieces: large enough that each copy runs at PCIe speed and the
// per-piece thread start-up is noise, small enough that the staging stays under 100 MiB.
constexpr size_t kPieceElements = size_t{16} << 20;
constexpr int kSlots = 3;
// Page faults on a cold file are served faster with several in flight.
constexpr int kMaxFillThreads = 8;

// Tells the kernel that [data, data + bytes) is wanted soon, so its pages are read ahead while the
// current piece is copied. Advice only: failures are ignored.
void advise_will_need(const void* data, size_t bytes) {
  if (bytes == 0) return;
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data) / page * page;
  const uintptr_t end = reinterpret_cast<uintptr_t>(data) + bytes;
  posix_madvise(reinterpret_cast<void*>(begin), end - begin, POSIX_MADV_WILLNEED);
}

// Elements [begin, end) of `view` as bf16 bits into out[0 .. end - begin).
void fill_range(const WeightView& view, size_t begin, size_t end, uint16_t* out) {
  const uint8_t* bytes = static_cast<const uint8_t*>(view.data);
  switch (view.dtype) {
    case TensorDtype::kBF16:
      std::memcpy(out, bytes + 2 * begin, 2 * (end - begin));
      return;
    case TensorDtype::kF32: {
      const float* values = static_cast<const float*>(view.data);
      for (size_t i = begin; i < end; ++i) out[i - begin] = f32_to_bf16(values[i]);
      return;
    }
    case TensorDtype::kF16:
      for (size_t i = begin; i < end; ++i) {
        uint16_t bits;
        std::memcpy(&bits, bytes + 2 * i, sizeof(bits));
        out[i - begin] = f32_to_bf16(f16_to_f32(bits));
      }
      return;
    case TensorDtype::kF8E4M3:
      throw Error("internal: an FP8 weight view (the loader widens FP8 matrices)");
  }
}

}  // namespace

WeightUploader::WeightUploader(cudaStream_t stream)
    : stream_(stream),
      fill_threads_(static_cast<int>(
          std::clamp<unsigned>(std::thread::hardware_concurrency(), 1, kMaxFillThreads))) {
  slots_.resize(kSlots);
  for (Slot& slot : slots_) {
    void* host = nullptr;
    check(cudaHostAlloc(&host, kPieceElements * sizeof(uint16_t), cudaHostAllocDefault),
          "cudaHostAlloc (weight staging)");
    slot.host = static_cast<uint16_t*>(host);
    check(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming), "cudaEventCreate");
  }
}

WeightUploader::~WeightUploader() {
  for (Slot& slot : slots_) {
    if (slot.in_flight) cudaEventSynchronize(slot.copied);
    if (slot.copied != nullptr) cudaEventDestroy(slot.copied);
    if (slot.host != nullptr) cudaFreeHost(slot.host);
  }
}

WeightUploader::Slot& WeightUploader::next_slot() {
  Slot& slot = slots_[next_];
  next_ = (next_ + 1) % slots_.size();
  if (slot.in_flight) check(cudaEventSynchronize(slot.copied), "weight upload");
  slot.in_flight = false;
  return slot;
}

void WeightUploader::upload(const WeightView& view, bf16* target) {
  const size_t count = static_cast<size_t>(view.numel());
  const size_t element_bytes = view.dtype == TensorDtype::kF32 ? 4 : 2;
  const uint8_t* source = static_cast<const uint8_t*>(view.data);
  advise_will_need(source, std::min(count, kPieceElements) * element_bytes);
  for (size_t done = 0; done < count;) {
    const size_t piece = std::min(kPieceElements, count - done);
    const size_t after = std::min(kPieceElements, count - done - piece);
    advise_will_need(source + (done + piece) * element_bytes, after * element_bytes);
    Slot& slot = next_slot();
    // Slices of whole pages' worth, one per thread; a small piece takes one thread.
    const int threads =
        static_cast<int>(std::clamp<size_t>(piece / (size_t{1} << 18), 1, fill_threads_));
    const size_t slice = (piece + threads - 1) / threads;
    std::vector<std::thread> workers;
    for (int t = 1; t < threads; ++t) {
      const size_t begin = std::min(piece, t * slice), end = std::min(piece, begin + slice);
      workers.emplace_back(fill_range, std::cref(view), done + begin, done + end,
                           slot.host + begin);
    }
    fill_range(view, done, done + std::min(piece, slice), slot.host);
    for (std::thread& worker : workers) worker.join();
    check(cudaMemcpyAsync(target + done, slot.host, piece * sizeof(uint16_t),
                          cudaMemcpyHostToDevice, stream_),
          "cudaMemcpyAsync (weights)");
    check(cudaEventRecord(slot.copied, stream_), "cudaEventRecord");
    slot.in_flight = true;
    done += piece;
    bytes_read_ += piece * element_bytes;
  }
}

void WeightUploader::finish() {
  for (Slot& slot : slots_) {
    if (slot.in_flight) check(cudaEventSynchronize(slot.copied), "weight upload");
    slot.in_flight = false;
  }
}

}  // namespace entropyinfer::cuda
