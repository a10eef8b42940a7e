// Streams weight matrices from host memory (in practice a checkpoint's memory map) into device
// bf16 buffers, without a host copy of the model: pieces go through a ring of pinned staging
// buffers, so that while the GPU copies one piece, host threads fill the next from the mapping
// (faulting the file in, several pages at once, with the piece after it already advised to the
// kernel for read-ahead). bf16 is copied as stored; fp32, f16 and FP8 (times its scales) are
// rounded to bf16 on the host, to nearest even, as PyTorch casts; FP8 codes can also go up as
// stored.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backends/cuda/cuda_common.h"
#include "model/model_weights.h"

namespace entropyinfer::cuda {

class WeightUploader {
 public:
  // `stream` carries the copies (so work queued after them on it sees the weights).
  explicit WeightUploader(cudaStream_t stream);
  ~WeightUploader();
  WeightUploader(const WeightUploader&) = delete;
  WeightUploader& operator=(const WeightUploader&) = delete;

  // Queues `view`'s elements, as bf16, into target[0 .. view.numel()). Returns once the last piece
  // is queued; the source must stay mapped until finish().
  void upload(const WeightView& view, bf16* target);
  // An FP8 view's codes, as stored, into target[0 .. view.numel()).
  void upload_codes(const WeightView& view, uint8_t* target);
  // Waits for every queued copy.
  void finish();

  size_t bytes_read() const { return bytes_read_; }

 private:
  struct Slot {
    uint16_t* host = nullptr;  // pinned, kPieceElements bf16 values
    cudaEvent_t copied = nullptr;
    bool in_flight = false;
  };
  Slot& next_slot();
  // Fills staging with elements [begin, end) of a view, in the target's element type.
  using FillPiece = void (*)(const WeightView& view, size_t begin, size_t end, uint16_t* out);
  void stream_pieces(const WeightView& view, void* target, size_t target_bytes, FillPiece fill);

  cudaStream_t stream_;
  std::vector<Slot> slots_;
  size_t next_ = 0;
  size_t bytes_read_ = 0;
  int fill_threads_;
};

}  // namespace entropyinfer::cuda
