// Loading Hugging Face model folders written on the fly: every family, dtype and layout loads to
// the exact values written, and every way a folder can be wrong ends in an Error naming the
// problem.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "engine/transformer.h"
#include "model/model_weights.h"
#include "safetensors_writer.h"
#include "test_support.h"

namespace entropyinfer {
namespace {

using nlohmann::json;
using testing::error_message_of;
using testing::mentions_all;
using testing::TempFolder;
using testing::TensorToWrite;
using testing::TinyModel;
using testing::TinyModelSpec;

std::string load_error(const std::string& folder) {
  return error_message_of([&] { load_hf_model(folder); });
}

// Every view the loader filled, by Hugging Face name.
std::vector<std::pair<std::string, const WeightView*>> named_views(const ModelWeights& weights) {
  std::vector<std::pair<std::string, const WeightView*>> views = {
      {"model.embed_tokens.weight", &weights.token_embedding},
      {"model.norm.weight", &weights.final_norm},
      {"lm_head.weight", &weights.lm_head}};
  for (size_t i = 0; i < weights.layers.size(); ++i) {
    const LayerWeights& layer = weights.layers[i];
    const std::string prefix = "model.layers." + std::to_string(i) + ".";
    const std::string attn = prefix + "self_attn.";
    views.insert(views.end(), {{prefix + "input_layernorm.weight", &layer.attn_norm},
                               {attn + "q_proj.weight", &layer.q_proj},
                               {attn + "k_proj.weight", &layer.k_proj},
                               {attn + "v_proj.weight", &layer.v_proj},
                               {attn + "o_proj.weight", &layer.o_proj},
                               {attn + "q_proj.bias", &layer.q_bias},
                               {attn + "k_proj.bias", &layer.k_bias},
                               {attn + "v_proj.bias", &layer.v_bias},
                               {attn + "o_proj.bias", &layer.o_bias},
                               {attn + "q_norm.weight", &layer.q_norm},
                               {attn + "k_norm.weight", &layer.k_norm},
                               {prefix + "post_attention_layernorm.weight", &layer.mlp_norm},
                               {prefix + "mlp.gate_proj.weight", &layer.gate_proj},
                               {prefix + "mlp.up_proj.weight", &layer.up_proj},
                               {prefix + "mlp.down_proj.weight", &layer.down_proj}});
  }
  return views;
}

// Each tensor written is in its view with the same shape and bit-identical values; views for
// tensors not written are empty (the lm_head of a tied model is the embedding). Matrices keep the
// element type `matrix_dtype` they were stored in; vectors are fp32.
void expect_weights_match(const ModelWeights& weights, const TinyModel& model,
                          TensorDtype matrix_dtype = TensorDtype::kF32) {
  for (const auto& [name, view] : named_views(weights)) {
    if (name == "lm_head.weight" && weights.config.tied_embeddings) {
      EXPECT_EQ(view->data, weights.token_embedding.data) << "tied lm_head must be the embedding";
      EXPECT_EQ(view->shape, weights.token_embedding.shape);
      continue;
    }
    auto written = model.values.find(name);
    if (written == model.values.end()) {
      EXPECT_TRUE(view->empty()) << name << " was not written but is loaded";
      continue;
    }
    ASSERT_FALSE(view->empty()) << name;
    EXPECT_EQ(view->shape, model.shapes.at(name)) << name;
    ASSERT_EQ(view->numel(), static_cast<int64_t>(written->second.size())) << name;
    EXPECT_EQ(view->dtype, view->shape.size() == 2 ? matrix_dtype : TensorDtype::kF32) << name;
    std::vector<float> loaded(written->second.size());
    for (size_t i = 0; i < loaded.size(); ++i) loaded[i] = view->value(static_cast<int64_t>(i));
    EXPECT_EQ(std::memcmp(loaded.data(), written->second.data(), loaded.size() * 4), 0)
        << name << " differs from what was written";
  }
}

size_t written_bytes(const TinyModel& model, const std::string& dtype) {
  const size_t element = dtype == "F32" ? 4 : 2;
  size_t total = 0;
  for (const auto& [name, values] : model.values) total += values.size() * element;
  return total;
}

size_t written_elements(const TinyModel& model) {
  size_t total = 0;
  for (const auto& [name, values] : model.values) total += values.size();
  return total;
}

// Elements of the matrices (2-D tensors) alone.
size_t written_matrix_elements(const TinyModel& model) {
  size_t total = 0;
  for (const auto& [name, values] : model.values) {
    if (model.shapes.at(name).size() == 2) total += values.size();
  }
  return total;
}

struct FamilyCase {
  std::string architecture;
  bool tied;
  bool attention_bias;
};

const FamilyCase kFamilyCases[] = {
    {"LlamaForCausalLM", false, false},   {"LlamaForCausalLM", true, true},
    {"Qwen2ForCausalLM", true, false},    {"Qwen3ForCausalLM", false, false},
    {"MistralForCausalLM", false, false}, {"PanguEmbeddedForCausalLM", false, true},
};

TEST(HfLoader, EveryFamilyAndDtypeLoadsTheExactValuesWritten) {
  for (const FamilyCase& family : kFamilyCases) {
    for (const std::string dtype : {"F32", "BF16", "F16"}) {
      SCOPED_TRACE(family.architecture + (family.tied ? " tied " : " untied ") + dtype);
      TempFolder folder("hf-family");
      TinyModelSpec spec;
      spec.architecture = family.architecture;
      spec.tie_word_embeddings = family.tied;
      spec.attention_bias = family.attention_bias;
      spec.dtype = dtype;
      if (family.architecture == "Qwen3ForCausalLM") spec.head_dim = 8;  // != hidden/heads (4)
      const TinyModel model = testing::write_tiny_model(folder.path(), spec);
      const ModelWeights weights = load_hf_model(folder.path());
      EXPECT_EQ(weights.config.architecture, family.architecture);
      EXPECT_EQ(weights.config.tied_embeddings, family.tied);
      ASSERT_EQ(weights.layers.size(), 2u);
      const TensorDtype stored = dtype == "F32"    ? TensorDtype::kF32
                                 : dtype == "BF16" ? TensorDtype::kBF16
                                                   : TensorDtype::kF16;
      expect_weights_match(weights, model, stored);
      EXPECT_EQ(weights.mapped_files.size(), 1u);
      if (dtype == "F32") {
        EXPECT_EQ(weights.mapped_bytes, written_bytes(model, dtype));
        EXPECT_EQ(weights.owned_bytes, 0u);
        EXPECT_TRUE(weights.owned_buffers.empty());
      } else {
        // Matrices in place at two bytes an element; only the vectors are widened copies.
        const size_t matrix_elements = written_matrix_elements(model);
        EXPECT_EQ(weights.mapped_bytes, matrix_elements * 2);
        EXPECT_EQ(weights.owned_bytes, (written_elements(model) - matrix_elements) * sizeof(float));
      }
    }
  }
}

TEST(HfLoader, FamilyFlagsDecideWhichTensorsAreLoaded) {
  TempFolder folder("hf-flags");
  TinyModelSpec spec;
  spec.architecture = "Qwen2ForCausalLM";
  testing::write_tiny_model(folder.path(), spec);
  const ModelWeights qwen2 = load_hf_model(folder.path());
  EXPECT_FALSE(qwen2.layers[1].q_bias.empty());
  EXPECT_FALSE(qwen2.layers[1].v_bias.empty());
  EXPECT_TRUE(qwen2.layers[1].o_bias.empty());
  EXPECT_TRUE(qwen2.layers[1].q_norm.empty());
  EXPECT_EQ(qwen2.layers[1].k_bias.shape, (std::vector<int64_t>{8}));  // 2 kv heads x head_dim 4
}

TEST(HfLoader, MatricesPointIntoTheMappingInTheirStoredType) {
  for (const std::string dtype : {"F32", "BF16", "F16"}) {
    SCOPED_TRACE(dtype);
    TempFolder folder("hf-inplace");
    TinyModelSpec spec;
    spec.dtype = dtype;
    testing::write_tiny_model(folder.path(), spec);
    const ModelWeights weights = load_hf_model(folder.path());
    ASSERT_EQ(weights.mapped_files.size(), 1u);
    const MappedFile& file = weights.mapped_files.front();
    const uint8_t* begin = file.data();
    const uint8_t* end = file.data() + file.size();
    for (const auto& [name, view] : named_views(weights)) {
      if (view->empty() || (view->shape.size() == 1 && dtype != "F32")) continue;
      const auto* data = static_cast<const uint8_t*>(view->data);
      EXPECT_TRUE(data >= begin && data + view->byte_size() <= end) << name;
    }
  }
}

TEST(HfLoader, ShardedIndexLoadsEveryShardOnce) {
  for (const std::string dtype : {"F32", "BF16"}) {
    SCOPED_TRACE(dtype);
    TempFolder folder("hf-sharded");
    TinyModelSpec spec;
    spec.num_shards = 3;
    spec.dtype = dtype;
    spec.num_layers = 3;
    const TinyModel model = testing::write_tiny_model(folder.path(), spec);
    ASSERT_EQ(model.weight_files.size(), 3u);
    ASSERT_FALSE(std::filesystem::exists(folder.file("model.safetensors")));
    const ModelWeights weights = load_hf_model(folder.path());
    expect_weights_match(weights, model, dtype == "F32" ? TensorDtype::kF32 : TensorDtype::kBF16);
    EXPECT_EQ(weights.mapped_files.size(), 3u);
  }
}

TEST(HfLoader, ShardedTiedModel) {
  TempFolder folder("hf-sharded-tied");
  TinyModelSpec spec;
  spec.num_shards = 2;
  spec.tie_word_embeddings = true;
  spec.architecture = "Qwen2ForCausalLM";
  const TinyModel model = testing::write_tiny_model(folder.path(), spec);
  const ModelWeights weights = load_hf_model(folder.path());
  expect_weights_match(weights, model);
  EXPECT_EQ(weights.lm_head.data, weights.token_embedding.data);
}

struct ProgressLog {
  std::vector<std::pair<size_t, size_t>> calls;
};

void record_progress(size_t done, size_t total, void* user) {
  static_cast<ProgressLog*>(user)->calls.emplace_back(done, total);
}

TEST(HfLoader, ReportsProgressInBytesUpToTheTotal) {
  TempFolder folder("hf-progress");
  TinyModelSpec spec;
  spec.dtype = "BF16";
  const TinyModel model = testing::write_tiny_model(folder.path(), spec);
  ProgressLog log;
  load_hf_model(folder.path(), record_progress, &log);
  ASSERT_GE(log.calls.size(), 2u);
  const size_t total = written_bytes(model, "BF16");
  EXPECT_EQ(log.calls.front().first, 0u);
  EXPECT_EQ(log.calls.back().first, total);
  for (size_t i = 0; i < log.calls.size(); ++i) {
    EXPECT_EQ(log.calls[i].second, total);
    if (i > 0) {
      EXPECT_GE(log.calls[i].first, log.calls[i - 1].first);
    }
  }
}

TEST(HfLoader, IgnoresTheRotaryFrequencyBuffer) {
  TempFolder folder("hf-invfreq");
  TinyModelSpec spec;
  spec.edit_tensors = [](std::vector<TensorToWrite>& tensors) {
    tensors.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq",
                       "F32",
                       {2},
                       testing::encode_floats({1.0f, 0.01f}, "F32")});
  };
  testing::write_tiny_model(folder.path(), spec);
  const ModelWeights weights = load_hf_model(folder.path());
  EXPECT_EQ(weights.layers.size(), 2u);
  EXPECT_FALSE(weights.layers[0].q_proj.empty());
}

TEST(HfLoader, TiedModelWithAStoredClassifierUsesTheEmbedding) {
  TempFolder folder("hf-tied-extra");
  TinyModelSpec spec;
  spec.tie_word_embeddings = true;
  spec.edit_tensors = [](std::vector<TensorToWrite>& tensors) {
    TensorToWrite copy = tensors.front();  // the embedding
    copy.name = "lm_head.weight";
    tensors.push_back(copy);
  };
  testing::write_tiny_model(folder.path(), spec);
  const ModelWeights weights = load_hf_model(folder.path());
  EXPECT_EQ(weights.lm_head.data, weights.token_embedding.data);
}

TEST(HfLoader, MisalignedF32IsCopiedNotReadInPlace) {
  // The format does not require the header to be padded to 8 bytes; floats at a file offset of
  // 2 (mod 4) cannot be read from the mapping directly, so the loader copies them.
  TempFolder folder("hf-misaligned");
  TinyModelSpec spec;
  std::vector<TensorToWrite> captured;
  spec.edit_tensors = [&captured](std::vector<TensorToWrite>& tensors) { captured = tensors; };
  const TinyModel model = testing::write_tiny_model(folder.path(), spec);
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::string data;
  for (const TensorToWrite& tensor : captured) {
    header[tensor.name] = {{"dtype", tensor.dtype},
                           {"shape", tensor.shape},
                           {"data_offsets", {data.size(), data.size() + tensor.bytes.size()}}};
    data += tensor.bytes;
  }
  std::string header_text = header.dump();
  while ((8 + header_text.size()) % 8 != 2) header_text.push_back(' ');
  testing::write_safetensors_raw(folder.file("model.safetensors"), header_text, data);

  const ModelWeights weights = load_hf_model(folder.path());
  expect_weights_match(weights, model);
  EXPECT_EQ(weights.mapped_bytes, 0u);
  EXPECT_EQ(weights.owned_bytes, written_bytes(model, "F32"));
  for (const auto& [name, view] : named_views(weights)) {
    if (!view->empty()) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(view->data) % alignof(float), 0u) << name;
    }
  }
}

TEST(HfLoader, MixedDtypesInOneFile) {
  TempFolder folder("hf-mixed");
  TinyModelSpec spec;
  std::map<std::string, std::vector<float>> rounded_norms;
  spec.edit_tensors = [&rounded_norms](std::vector<TensorToWrite>& tensors) {
    for (TensorToWrite& tensor : tensors) {
      if (tensor.name.find("norm") == std::string::npos) continue;
      std::vector<float> values(tensor.bytes.size() / 4);
      std::memcpy(values.data(), tensor.bytes.data(), tensor.bytes.size());
      tensor.dtype = "BF16";
      tensor.bytes = testing::encode_floats(values, "BF16", &rounded_norms[tensor.name]);
    }
  };
  TinyModel model = testing::write_tiny_model(folder.path(), spec);
  ASSERT_FALSE(rounded_norms.empty());
  for (auto& [name, values] : rounded_norms) model.values[name] = values;
  const ModelWeights weights = load_hf_model(folder.path());
  expect_weights_match(weights, model);
  EXPECT_GT(weights.owned_bytes, 0u);
  EXPECT_GT(weights.mapped_bytes, 0u);
  EXPECT_EQ(weights.owned_bytes + weights.mapped_bytes, written_elements(model) * sizeof(float));
  EXPECT_EQ(weights.mapped_files.size(), 1u);
}

// ------------------------------------------------------------------------------------------------
// Bad folders

TEST(HfLoaderErrors, MissingFolder) {
  EXPECT_TRUE(mentions_all(load_error("/nonexistent/entropyinfer-model"),
                           {"/nonexistent/entropyinfer-model", "does not exist"}));
}

TEST(HfLoaderErrors, PathIsAFile) {
  TempFolder folder("hf-file");
  testing::write_file_bytes(folder.file("weights.bin"), "x");
  EXPECT_TRUE(mentions_all(load_error(folder.file("weights.bin")),
                           {folder.file("weights.bin"), "not a folder"}));
}

TEST(HfLoaderErrors, MissingConfigJson) {
  TempFolder folder("hf-noconfig");
  testing::write_tiny_model(folder.path(), TinyModelSpec{});
  std::filesystem::remove(folder.file("config.json"));
  EXPECT_TRUE(mentions_all(load_error(folder.path()), {folder.path(), "config.json"}));
}

TEST(HfLoaderErrors, NoWeightFiles) {
  TempFolder folder("hf-noweights");
  testing::write_tiny_model(folder.path(), TinyModelSpec{});
  std::filesystem::remove(folder.file("model.safetensors"));
  EXPECT_TRUE(mentions_all(load_error(folder.path()),
                           {folder.path(), "model.safetensors", "model.safetensors.index.json"}));
  testing::write_file_bytes(folder.file("pytorch_model.bin"), "x");
  EXPECT_TRUE(mentions_all(load_error(folder.path()), {"PyTorch .bin", "convert"}));
}

TEST(HfLoaderErrors, TruncatedSafetensors) {
  TempFolder folder("hf-trunc");
  testing::write_tiny_model(folder.path(), TinyModelSpec{});
  const std::string path = folder.file("model.safetensors");
  std::filesystem::resize_file(path, std::filesystem::file_size(path) / 2);
  EXPECT_TRUE(mentions_all(load_error(folder.path()), {path, "out of range"}));
}

TEST(HfLoaderErrors, UnsupportedArchitecture) {
  TempFolder folder("hf-arch");
  TinyModelSpec spec;
  spec.config_overrides = {{"architectures", {"GemmaForCausalLM"}}};
  testing::write_tiny_model(folder.path(), spec);
  EXPECT_TRUE(mentions_all(
      load_error(folder.path()),
      {folder.file("config.json"), "unsupported architecture 'GemmaForCausalLM'", "supported:"}));
}

TEST(HfLoaderErrors, TensorShapeContradictsConfig) {
  TempFolder folder("hf-shape");
  TinyModelSpec spec;
  spec.config_overrides = {{"intermediate_size", 20}};  // the weights are written for 24
  testing::write_tiny_model(folder.path(), spec);
  EXPECT_TRUE(mentions_all(load_error(folder.path()),
                           {"'model.layers.0.mlp.gate_proj.weight'", "shape [24, 16]",
                            "implies [20, 16]", "intermediate_size 20"}));
}

TEST(HfLoaderErrors, KvHeadCountContradictsWeights) {
  TempFolder folder("hf-kvshape");
  TinyModelSpec spec;
  spec.config_overrides = {{"num_key_value_heads", 4}};  // written with 2
  testing::write_tiny_model(folder.path(), spec);
  EXPECT_TRUE(
      mentions_all(load_error(folder.path()), {"'model.layers.0.self_attn.k_proj.weight'",
                                               "[8, 16]", "[16, 16]", "num_key_value_heads 4"}));
}

TEST(HfLoaderErrors, MissingTensor) {
  TempFolder folder("hf-missing");
  TinyModelSpec spec;
  spec.edit_tensors = [](std::vector<TensorToWrite>& tensors) {
    std::erase_if(tensors, [](const TensorToWrite& tensor) {
      return tensor.name == "model.layers.1.self_attn.k_proj.weight";
    });
  };
  testing::write_tiny_model(folder.path(), spec);
  EXPECT_TRUE(mentions_all(
      load_error(folder.path()),
      {"'model.layers.1.self_attn.k_proj.weight'", "missing", folder.file("model.safetensors")}));
}

TEST(HfLoaderErrors, MissingBiasThatTheFamilyRequires) {
  TempFolder folder("hf-missing-bias");
  TinyModelSpec spec;
  spec.architecture = "PanguEmbeddedForCausalLM";
  spec.attention_bias = false;               // weights without bias ...
  spec.config_overrides = {{"bias", true}};  // ... but config.json says there is
  testing::write_tiny_model(folder.path(), spec);
  EXPECT_TRUE(mentions_all(load_error(folder.path()),
                           {"'model.layers.0.self_attn.o_proj.bias'", "missing"}));
}

TEST(HfLoaderErrors, UntiedModelWithoutClassifier) {
  TempFolder folder("hf-nohead");
  TinyModelSpec spec;
  spec.edit_tensors = [](std::vector<TensorToWrite>& tensors) {
    std::erase_if(tensors, [](const TensorToWrite& t) { return t.name == "lm_head.weight"; });
  };
  testing::write_tiny_model(folder.path(), spec);
  EXPECT_TRUE(mentions_all(load_error(folder.path()),
                           {"'lm_head.weight'", "missing", "tie_word_embeddings false"}));
}

TEST(HfLoaderErrors, TensorsTheConfigDoesNotAccountFor) {
  TempFolder folder("hf-extra");
  TinyModelSpec spec;
  spec.attention_bias = true;                           // weights with bias ...
  spec.config_overrides = {{"attention_bias", false}};  // ... but config.json says none
  testing::write_tiny_model(folder.path(), spec);
  EXPECT_TRUE(mentions_all(load_error(folder.path()),
                           {"'model.layers.0.self_attn.o_proj.bias'", "q/k/v bias off"}));
}

TEST(HfLoaderErrors, MoreLayersThanTheConfigSays) {
  TempFolder folder("hf-layers");
  TinyModelSpec spec;
  spec.num_layers = 3;
  spec.config_overrides = {{"num_hidden_layers", 2}};
  testing::write_tiny_model(folder.path(), spec);
  EXPECT_TRUE(mentions_all(load_error(folder.path()), {"model.layers.2.", "2 layers"}));
}

TEST(HfLoaderErrors, UnknownDtypeInTheWeights) {
  TempFolder folder("hf-dtype");
  TinyModelSpec spec;
  spec.edit_tensors = [](std::vector<TensorToWrite>& tensors) {
    tensors[3].dtype = "I8";
    tensors[3].bytes.resize(tensors[3].bytes.size() / 4);
  };
  testing::write_tiny_model(folder.path(), spec);
  EXPECT_TRUE(mentions_all(load_error(folder.path()),
                           {folder.file("model.safetensors"), "'I8'", "tensor '"}));
}

TEST(HfLoaderErrors, MissingShardFile) {
  TempFolder folder("hf-noshard");
  TinyModelSpec spec;
  spec.num_shards = 3;
  const TinyModel model = testing::write_tiny_model(folder.path(), spec);
  std::filesystem::remove(folder.file(model.weight_files[1]));
  EXPECT_TRUE(mentions_all(load_error(folder.path()), {"model.safetensors.index.json",
                                                       model.weight_files[1], "does not exist"}));
}

TEST(HfLoaderErrors, IndexPointsToAShardWithoutTheTensor) {
  TempFolder folder("hf-badindex");
  TinyModelSpec spec;
  spec.num_shards = 2;
  const TinyModel model = testing::write_tiny_model(folder.path(), spec);
  json index = json::parse(testing::read_file_bytes(folder.file("model.safetensors.index.json")));
  index["weight_map"]["model.norm.weight"] = model.weight_files[0];  // it is in the last shard
  testing::write_file_bytes(folder.file("model.safetensors.index.json"), index.dump());
  EXPECT_TRUE(mentions_all(load_error(folder.path()), {"'model.norm.weight'", model.weight_files[0],
                                                       "no tensor of that name"}));
}

TEST(HfLoaderErrors, IndexNotJson) {
  TempFolder folder("hf-indexjson");
  TinyModelSpec spec;
  spec.num_shards = 2;
  testing::write_tiny_model(folder.path(), spec);
  testing::write_file_bytes(folder.file("model.safetensors.index.json"), "{\"weight_map\": ");
  EXPECT_TRUE(
      mentions_all(load_error(folder.path()), {"model.safetensors.index.json", "not valid JSON"}));
}

TEST(HfLoaderErrors, IndexWithoutWeightMap) {
  TempFolder folder("hf-indexmap");
  TinyModelSpec spec;
  spec.num_shards = 2;
  testing::write_tiny_model(folder.path(), spec);
  testing::write_file_bytes(folder.file("model.safetensors.index.json"), "{\"metadata\": {}}");
  EXPECT_TRUE(mentions_all(load_error(folder.path()), {"weight_map"}));
}

TEST(HfLoaderErrors, ShardOutsideTheFolder) {
  TempFolder folder("hf-escape");
  TinyModelSpec spec;
  spec.num_shards = 2;
  testing::write_tiny_model(folder.path(), spec);
  json index = json::parse(testing::read_file_bytes(folder.file("model.safetensors.index.json")));
  index["weight_map"]["model.norm.weight"] = "../elsewhere.safetensors";
  testing::write_file_bytes(folder.file("model.safetensors.index.json"), index.dump());
  EXPECT_TRUE(mentions_all(load_error(folder.path()),
                           {"'../elsewhere.safetensors'", "not a file inside the model folder"}));
}

TEST(HfLoaderErrors, CorruptShardIsNamed) {
  TempFolder folder("hf-corrupt-shard");
  TinyModelSpec spec;
  spec.num_shards = 2;
  const TinyModel model = testing::write_tiny_model(folder.path(), spec);
  testing::write_safetensors_raw(folder.file(model.weight_files[1]), "{}", "", 4096);
  EXPECT_TRUE(mentions_all(load_error(folder.path()),
                           {folder.file(model.weight_files[1]), "past the end"}));
}

// `weights` with every matrix widened to fp32 in buffers of its own (vectors are fp32 already).
ModelWeights widened_to_fp32(const ModelWeights& weights) {
  ModelWeights widened;
  widened.config = weights.config;
  widened.final_norm = weights.final_norm;
  const auto widen = [&widened](const WeightView& view) {
    if (view.empty() || view.dtype == TensorDtype::kF32) return view;
    auto buffer = std::make_unique<float[]>(static_cast<size_t>(view.numel()));
    for (int64_t i = 0; i < view.numel(); ++i) buffer[i] = view.value(i);
    WeightView copy{buffer.get(), view.shape};
    widened.owned_buffers.push_back(std::move(buffer));
    return copy;
  };
  widened.token_embedding = widen(weights.token_embedding);
  widened.lm_head = widen(weights.lm_head);
  for (const LayerWeights& layer : weights.layers) {
    LayerWeights copy = layer;
    for (WeightView* matrix : {&copy.q_proj, &copy.k_proj, &copy.v_proj, &copy.o_proj,
                               &copy.gate_proj, &copy.up_proj, &copy.down_proj}) {
      *matrix = widen(*matrix);
    }
    widened.layers.push_back(copy);
  }
  return widened;
}

// The CPU computes with 16-bit matrices as stored: a BF16 or F16 checkpoint must give, bit for
// bit, the logits of its own values widened to fp32. An MLP width of 36 takes the down
// projection through both the vector loop and its scalar tail.
TEST(HfLoader, SixteenBitCheckpointsComputeTheLogitsOfTheirFp32Widening) {
  for (const std::string dtype : {"BF16", "F16"}) {
    SCOPED_TRACE(dtype);
    TempFolder folder("hf-stored-type");
    TinyModelSpec spec;
    spec.dtype = dtype;
    spec.hidden_size = 24;
    spec.intermediate_size = 36;
    spec.attention_bias = true;
    testing::write_tiny_model(folder.path(), spec);
    const ModelWeights weights = load_hf_model(folder.path());
    ASSERT_EQ(weights.layers[0].gate_proj.dtype,
              dtype == "BF16" ? TensorDtype::kBF16 : TensorDtype::kF16);
    const ModelWeights widened = widened_to_fp32(weights);
    ASSERT_EQ(widened.layers[0].gate_proj.dtype, TensorDtype::kF32);
    const std::vector<int32_t> tokens = {1, 7, 3, 39, 12, 5, 0, 21, 8, 30};
    Transformer as_stored(weights, 64), as_fp32(widened, 64);
    const std::vector<float> stored_logits = as_stored.forward(tokens, /*all_logits=*/true);
    const std::vector<float> fp32_logits = as_fp32.forward(tokens, /*all_logits=*/true);
    ASSERT_EQ(stored_logits.size(), 10u * 40u);
    ASSERT_EQ(fp32_logits.size(), stored_logits.size());
    EXPECT_EQ(
        std::memcmp(stored_logits.data(), fp32_logits.data(), stored_logits.size() * sizeof(float)),
        0);
  }
}

}  // namespace
}  // namespace entropyinfer

namespace entropyinfer {
namespace {

// The E4M3 code of a value it holds exactly (the tiny model's weights are chosen to be).
char exact_e4m3(float value) {
  for (int code = 0; code < 256; ++code) {
    if (fp8_e4m3_to_f32(static_cast<uint8_t>(code)) == value) return static_cast<char>(code);
  }
  throw std::invalid_argument("no E4M3 code holds " + std::to_string(value));
}

std::vector<float> decode_f32(const std::string& bytes) {
  std::vector<float> values(bytes.size() / 4);
  std::memcpy(values.data(), bytes.data(), bytes.size());
  return values;
}

struct Fp8Case {
  std::string name;
  json quantization_config;
  bool per_channel = true;
  std::string scale_dtype = "F32";
  bool input_scales = false;
  std::string expected_scheme;
  bool drop_a_scale = false;  // layer 0's q_proj loses its scales
  float first_scale = 0.0f;   // nonzero: layer 0's q_proj's first scale becomes this
};

json compressed_tensors(const std::string& strategy, const json& input_activations) {
  return {{"quant_method", "compressed-tensors"},
          {"format", "float-quantized"},
          {"ignore", {"lm_head"}},
          {"config_groups",
           {{"group_0",
             {{"targets", {"Linear"}},
              {"weights",
               {{"num_bits", 8},
                {"type", "float"},
                {"strategy", strategy},
                {"symmetric", true},
                {"dynamic", false}}},
              {"input_activations", input_activations}}}}}};
}

// A tiny model written in F32, then its projections re-stored as FP8 with scales: row r of a
// per-channel matrix scaled by 2^-(8 + r % 2), so that every weight k/256 (|k| <= 16) is an exact
// E4M3 value times its row's scale. Loading must give back exactly the F32 values.
void write_fp8_model(const std::string& folder, const Fp8Case& c, TinyModel* model) {
  TinyModelSpec spec;
  spec.weight_steps = 16;
  spec.config_overrides = {{"quantization_config", c.quantization_config}};
  spec.edit_tensors = [&c](std::vector<TensorToWrite>& tensors) {
    std::vector<TensorToWrite> added;
    for (TensorToWrite& tensor : tensors) {
      const std::string suffix = "_proj.weight";
      if (tensor.name.size() < suffix.size() ||
          tensor.name.compare(tensor.name.size() - suffix.size(), suffix.size(), suffix) != 0)
        continue;
      const std::vector<float> values = decode_f32(tensor.bytes);
      const int64_t rows = tensor.shape[0], columns = tensor.shape[1];
      std::vector<float> scales;
      std::string codes;
      for (int64_t row = 0; row < rows; ++row) {
        const float scale = c.per_channel && row % 2 == 1 ? 0x1p-9f : 0x1p-8f;
        if (c.per_channel || row == 0) scales.push_back(scale);
        for (int64_t column = 0; column < columns; ++column)
          codes.push_back(exact_e4m3(values[static_cast<size_t>(row * columns + column)] / scale));
      }
      tensor.dtype = "F8_E4M3";
      tensor.bytes = codes;
      if (c.drop_a_scale && tensor.name == "model.layers.0.self_attn.q_proj.weight") continue;
      if (c.first_scale != 0.0f && tensor.name == "model.layers.0.self_attn.q_proj.weight")
        scales.at(0) = c.first_scale;
      const std::vector<int64_t> scale_shape =
          c.per_channel ? std::vector<int64_t>{rows, 1} : std::vector<int64_t>{1};
      added.push_back({tensor.name + "_scale", c.scale_dtype, scale_shape,
                       testing::encode_floats(scales, c.scale_dtype)});
      if (c.input_scales) {
        const std::string base = tensor.name.substr(0, tensor.name.size() - 6);
        // k_proj's differs, so the fused q/k/v product must take the largest of the three.
        const float input_scale = tensor.name.find("k_proj") != std::string::npos ? 0.75f : 0.5f;
        added.push_back(
            {base + "input_scale", "F32", {1}, testing::encode_floats({input_scale}, "F32")});
      }
    }
    tensors.insert(tensors.end(), added.begin(), added.end());
  };
  *model = testing::write_tiny_model(folder, spec);
}

// The projections stay FP8 as stored, each element meaning exactly its F32 original. Weights-only
// checkpoints then compute exactly the F32 model; the others quantize every product's input
// rows, which moves the logits a little, never a lot.
TEST(HfLoaderFp8, CheckpointsOfEachFormatLoadAsStoredWithTheExactValues) {
  const std::vector<Fp8Case> cases = {
      {"compressed-tensors, channel scales, dynamic per-token activations",
       compressed_tensors(
           "channel",
           {{"num_bits", 8}, {"type", "float"}, {"strategy", "token"}, {"dynamic", true}}),
       true, "BF16", false, "compressed-tensors (activations: dynamic per-token)"},
      {"compressed-tensors, one scale per tensor, static activation scales",
       compressed_tensors(
           "tensor",
           {{"num_bits", 8}, {"type", "float"}, {"strategy", "tensor"}, {"dynamic", false}}),
       false, "F32", true, "compressed-tensors (activations: static per-tensor)"},
      {"compressed-tensors, weights only", compressed_tensors("channel", nullptr), true, "F32",
       false, "compressed-tensors (activations: none)"},
      {"fbgemm_fp8",
       {{"quant_method", "fbgemm_fp8"},
        {"activation_scale_ub", 1200.0},
        {"modules_to_not_convert", {"lm_head"}}},
       true,
       "F32",
       false,
       "fbgemm_fp8 (activations: dynamic per-token, bound 1200.000000)"},
  };
  TempFolder reference_folder("hf-fp8-reference");
  TinyModelSpec reference_spec;
  reference_spec.weight_steps = 16;
  const TinyModel reference = testing::write_tiny_model(reference_folder.path(), reference_spec);
  const ModelWeights reference_weights = load_hf_model(reference_folder.path());
  const std::vector<int32_t> tokens = {1, 5, 9, 3, 7};
  const std::vector<float> reference_logits = Transformer(reference_weights).forward(tokens);
  float largest = 0.0f;
  for (float logit : reference_logits) largest = std::max(largest, std::fabs(logit));
  for (const Fp8Case& c : cases) {
    SCOPED_TRACE(c.name);
    TempFolder folder("hf-fp8");
    TinyModel model;
    write_fp8_model(folder.path(), c, &model);
    const ModelWeights weights = load_hf_model(folder.path());
    EXPECT_EQ(weights.fp8_scheme, c.expected_scheme);
    for (const auto& [name, view] : named_views(weights)) {
      const auto written_values = reference.values.find(name);
      if (written_values == reference.values.end() || view == &weights.lm_head) continue;
      const bool projection = name.find("_proj.weight") != std::string::npos;
      EXPECT_EQ(view->dtype, projection ? TensorDtype::kF8E4M3 : TensorDtype::kF32) << name;
      ASSERT_FALSE(view->empty()) << name;
      const std::vector<float>& written = written_values->second;
      std::vector<float> loaded(written.size());
      for (size_t i = 0; i < loaded.size(); ++i) loaded[i] = view->value(static_cast<int64_t>(i));
      EXPECT_EQ(std::memcmp(loaded.data(), written.data(), loaded.size() * 4), 0) << name;
      if (c.input_scales && projection) {
        const bool fused_with_k = name.find("q_proj") != std::string::npos ||
                                  name.find("k_proj") != std::string::npos ||
                                  name.find("v_proj") != std::string::npos;
        EXPECT_EQ(view->input_scale, fused_with_k ? 0.75f : 0.5f) << name;
      }
    }
    const std::vector<float> logits = Transformer(weights).forward(tokens);
    ASSERT_EQ(logits.size(), reference_logits.size());
    if (c.quantization_config.dump().find("\"input_activations\":null") != std::string::npos) {
      EXPECT_EQ(logits, reference_logits);
      continue;
    }
    // Quantized inputs: every logit within 5% of the largest, and not all equal to the F32 ones.
    float deviation = 0.0f;
    for (size_t i = 0; i < logits.size(); ++i)
      deviation = std::max(deviation, std::fabs(logits[i] - reference_logits[i]));
    EXPECT_LT(deviation, 0.05f * largest);
    EXPECT_GT(deviation, 0.0f) << "the inputs were not quantized";
  }
}

TEST(HfLoaderFp8, UnsupportedVariantsAreOneErrorNamingTheField) {
  const json dynamic_tokens = {
      {"num_bits", 8}, {"type", "float"}, {"strategy", "token"}, {"dynamic", true}};
  struct BadCase {
    std::string name;
    std::function<void(Fp8Case&)> edit;
    std::vector<std::string> mentions;
  };
  const std::vector<BadCase> bad = {
      {"block-wise fp8",
       [](Fp8Case& c) {
         c.quantization_config = {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}};
       },
       {"quantization_config.quant_method", "'fp8'", "block-wise"}},
      {"unknown method",
       [](Fp8Case& c) {
         c.quantization_config = {{"quant_method", "gptq"}};
       },
       {"quantization_config.quant_method", "'gptq'"}},
      {"4-bit weights",
       [](Fp8Case& c) {
         c.quantization_config["config_groups"]["group_0"]["weights"]["num_bits"] = 4;
       },
       {"config_groups.group_0.weights.num_bits", "4"}},
      {"integer weights",
       [](Fp8Case& c) {
         c.quantization_config["config_groups"]["group_0"]["weights"]["type"] = "int";
       },
       {"config_groups.group_0.weights.type", "\"int\""}},
      {"group scales",
       [](Fp8Case& c) {
         c.quantization_config["config_groups"]["group_0"]["weights"]["strategy"] = "group";
       },
       {"config_groups.group_0.weights.strategy", "\"group\""}},
      {"no quantization_config",
       [](Fp8Case& c) { c.quantization_config = nullptr; },
       {"F8_E4M3", "no quantization_config", "q_proj.weight"}},
      {"missing scales",
       [](Fp8Case& c) { c.drop_a_scale = true; },
       {"'model.layers.0.self_attn.q_proj.weight_scale'", "missing"}},
      {"negative scale",
       [](Fp8Case& c) { c.first_scale = -0.5f; },
       {"'model.layers.0.self_attn.q_proj.weight_scale'", "-0.5", "index 0", "not negative"}},
      {"NaN scale",
       [](Fp8Case& c) { c.first_scale = std::nanf(""); },
       {"'model.layers.0.self_attn.q_proj.weight_scale'", "nan", "finite"}},
  };
  for (const BadCase& b : bad) {
    SCOPED_TRACE(b.name);
    Fp8Case c;
    c.quantization_config = compressed_tensors("channel", dynamic_tokens);
    b.edit(c);
    TempFolder folder("hf-fp8-bad");
    TinyModel model;
    write_fp8_model(folder.path(), c, &model);
    const std::string message = error_message_of([&] { load_hf_model(folder.path()); });
    for (const std::string& part : b.mentions)
      EXPECT_NE(message.find(part), std::string::npos) << part << " not in: " << message;
  }
}

}  // namespace
}  // namespace entropyinfer
