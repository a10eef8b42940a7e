#include <filesystem>

#include "core/error.h"
#include "model/model_weights.h"

namespace entropyinfer {

ModelWeights load_model(const std::string& path, LoadProgress progress, void* progress_user) {
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (error || !fs::exists(status)) throw Error("model path '" + path + "' does not exist");
  if (fs::is_directory(status)) return load_hf_model(path, progress, progress_user);
  if (fs::is_regular_file(status)) return load_llama2c_model(path);
  throw Error("model path '" + path +
              "' is neither a Hugging Face model folder nor a checkpoint file");
}

}  // namespace entropyinfer
