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
    case TensorDtype::kF8E4M3: {
      // Widened with the row scales (a weights-only FP8 checkpoint runs bf16 products).
      const int64_t width = view.shape.at(1);
      for (size_t i = begin; i < end; ++i) {
        const float scale = view.row_scale(static_cast<int64_t>(i) / width);
        out[i - begin] = f32_to_bf16(fp8_e4m3_to_f32(bytes[i]) * scale);
      }
      return;
    }
  }
}

// Elements [begin, end) of an FP8 view's codes, as stored, into out.
void fill_codes(const WeightView& view, size_t begin, size_t end, uint16_t* out) {
  std::memcpy(out, static_cast<const uint8_t*>(view.data) + begin, end - begin);
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
  stream_pieces(view, target, sizeof(bf16), &fill_range);
}

void WeightUploader::upload_codes(const WeightView& view, uint8_t* target) {
  if (!view.fp8()) throw Error("internal: upload_codes of a view that is not FP8");
  stream_pieces(view, target, 1, &fill_codes);
}

void WeightUploader::stream_pieces(const WeightView& view, void* target, size_t target_bytes,
                                   FillPiece fill) {
  const size_t count = static_cast<size_t>(view.numel());
  const size_t element_bytes = view.byte_size() / std::max<size_t>(count, 1);
  const uint8_t* source = static_cast<const uint8_t*>(view.data);
  auto* destination = static_cast<uint8_t*>(target);
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
    auto* staging = reinterpret_cast<uint8_t*>(slot.host);
    std::vector<std::thread> workers;
    for (int t = 1; t < threads; ++t) {
      const size_t begin = std::min(piece, t * slice), end = std::min(piece, begin + slice);
      workers.emplace_back(fill, std::cref(view), done + begin, done + end,
                           reinterpret_cast<uint16_t*>(staging + begin * target_bytes));
    }
    fill(view, done, done + std::min(piece, slice), slot.host);
    for (std::thread& worker : workers) worker.join();
    check(cudaMemcpyAsync(destination + done * target_bytes, slot.host, piece * target_bytes,
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
