// The CUDA transformer with an FP8 KV cache against the CPU Transformer with one (the reference:
// its rows are what the cache reads back, in fp32), on bf16-exact small models.
//
// The GPU quantizes rows of bf16 keys and values, the CPU rows of fp32 ones: a value within 2^-8
// of an E4M3 rounding boundary can take the neighbouring code on one side only (a step of up to
// 2^-3 relative), so the two caches differ in a few percent of their codes and the logits differ
// more than with bf16 caches. What is asserted:
//   - chunked prefill (four chunks: each later one reads the earlier rows back from the codes),
//     decode, a second prompt after reset(): relative L2 <= 5e-2 of the CPU's logits, the argmax
//     agreeing on >= 90% of the rows; the GPU's FP8 logits differ from its bf16-cache logits (the
//     option is applied) and the cache takes (head_dim + 4) / (2 head_dim) of the bf16 cache's
//     bytes;
//   - the entropy and CritiPrefill prefills under the FP8 cache read the CPU's fraction of keys
//     within 2% and their logits stay within relative L2 0.15 (the bound of the bf16-cache
//     comparison), with FP8 block-sparse prompt attention on a Hopper build;
//   - each decode method compresses to exactly the CPU's entry count, shrinks the cache, decodes
//     within relative L2 5e-2 with the argmax agreeing on >= 90% of the steps, and reset() gives
//     the full cache back.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>

#include "backends/cuda/flash_attention.h"
#include "engine/cuda/cuda_transformer.h"
#include "engine/transformer.h"
#include "gpu/gpu_test_support.h"
#include "gpu/model_test_support.h"

namespace entropyinfer {
namespace {

using gpu_test::Agreement;
using gpu_test::compare_rows;
using gpu_test::gpu_exact_model;
using gpu_test::small_config;

constexpr double kMaxRelativeL2 = 5e-2;

std::vector<int32_t> test_prompt(size_t length, int vocab) {
  std::vector<int32_t> prompt(length);
  for (size_t i = 0; i < prompt.size(); ++i)
    prompt[i] = static_cast<int32_t>((i * 7919 + 13) % vocab);
  return prompt;
}

AttentionConfig small_sparse(PrefillMethod method) {
  AttentionConfig config;
  config.prefill = method;
  config.prefill_params.segment_size = 64;
  config.prefill_params.block_size = 8;
  config.prefill_params.sparse_threshold = 128;
  config.prefill_params.base_budget = 128;
  config.prefill_params.critiprefill_budget = 128;
  config.decode_params.budget = 128;
  config.decode_params.window = 16;
  config.decode_params.gap = 8;
  return config;
}

TEST(CudaFp8KvCacheModel, ChunkedPrefillAndDecodeMatchTheCpuReference) {
  ENTROPYINFER_REQUIRE_GPU();
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE("model variant " + std::to_string(variant));
    const ModelConfig config = small_config(variant);
    const ModelWeights weights = gpu_exact_model(config, 7 + variant);
    Transformer cpu_model(weights, 1024, {}, /*fp8_kv_cache=*/true);
    cuda::CudaModelOptions options;
    options.context_length = 1024;
    options.chunk_tokens = 96;  // the 300-token prompt runs in four chunks
    cuda::CudaTransformer bf16_model(weights, options);
    options.fp8_kv_cache = true;
    cuda::CudaTransformer gpu_model(weights, options);
    EXPECT_TRUE(gpu_model.memory_plan().fp8_kv_cache);
    const double expected_ratio = (config.head_dim + 4.0) / (2.0 * config.head_dim);
    EXPECT_DOUBLE_EQ(static_cast<double>(gpu_model.kv_cache_bytes()) / bf16_model.kv_cache_bytes(),
                     expected_ratio);

    const auto prompt = test_prompt(300, config.vocab_size);
    Agreement agreement, against_bf16;
    const auto gpu_logits = gpu_model.forward(prompt, true);
    compare_rows(gpu_logits, cpu_model.forward(prompt, true), config.vocab_size, agreement);
    compare_rows(gpu_logits, bf16_model.forward(prompt, true), config.vocab_size, against_bf16);
    int32_t token = 5;
    for (int step = 0; step < 8; ++step) {
      const std::vector<int32_t> one = {token};
      const auto cpu_logits = cpu_model.forward(one);
      compare_rows(gpu_model.forward(one), cpu_logits, config.vocab_size, agreement);
      token = static_cast<int32_t>(std::max_element(cpu_logits.begin(), cpu_logits.end()) -
                                   cpu_logits.begin());
    }
    gpu_model.reset();
    cpu_model.reset();
    const std::vector<int32_t> short_prompt(prompt.begin(), prompt.begin() + 40);
    compare_rows(gpu_model.forward(short_prompt), cpu_model.forward(short_prompt),
                 config.vocab_size, agreement);
    std::cout << "[ measure ] variant " << variant << ": FP8 cache GPU vs CPU relative L2 "
              << agreement.worst_relative_l2 << ", argmax " << agreement.argmax_matches << "/"
              << agreement.rows << "; vs the GPU's bf16 cache " << against_bf16.worst_relative_l2
              << "\n";
    EXPECT_LE(agreement.worst_relative_l2, kMaxRelativeL2);
    EXPECT_GE(agreement.argmax_matches, 0.9 * agreement.rows);
    EXPECT_GT(against_bf16.worst_relative_l2, 0.0);
  }
}

// FP8 prompt attention (what CudaModelOptions::prompt_attention picks with the FP8 cache) on
// head_dim 128 and 64, in chunks (each chunk restages the keys before it) and layer by layer (one
// staging per layer): within relative L2 0.1 of the CPU's FP8-cache logits (the kernel alone stays
// within 0.1 of bf16 attention), the argmax agreeing on >= 90% of the rows, and different from
// bf16 prompt attention over the same cache (the option is applied).
TEST(CudaFp8KvCacheModel, Fp8PromptAttentionStaysNearTheCpuReference) {
  ENTROPYINFER_REQUIRE_GPU();
  if (!cuda::fp8_attention_available())
    GTEST_SKIP() << "FP8 attention needs an sm_90a build on a Hopper GPU";
  for (const int variant : {1, 0}) {
    const ModelConfig config = small_config(variant);
    SCOPED_TRACE("head_dim " + std::to_string(config.head_dim));
    const ModelWeights weights = gpu_exact_model(config, 8);
    Transformer cpu_model(weights, 1024, {}, /*fp8_kv_cache=*/true);
    const auto prompt = test_prompt(300, config.vocab_size);
    const auto expected = cpu_model.forward(prompt, true);
    for (const bool layer_major : {false, true}) {
      SCOPED_TRACE(layer_major ? "layer by layer" : "in chunks");
      cuda::CudaModelOptions options;
      options.context_length = 1024;
      options.chunk_tokens = 96;
      options.layer_major_prefill = layer_major;
      options.fp8_kv_cache = true;  // FP8 prompt attention follows it
      cuda::CudaTransformer fp8_attention(weights, options);
      EXPECT_TRUE(fp8_attention.memory_plan().fp8_prompt_attention);
      options.prompt_attention = cuda::CudaModelOptions::PromptAttention::kBf16;
      cuda::CudaTransformer bf16_attention(weights, options);
      EXPECT_FALSE(bf16_attention.memory_plan().fp8_prompt_attention);
      Agreement agreement, against_bf16;
      const auto logits = fp8_attention.forward(prompt, true);
      compare_rows(logits, expected, config.vocab_size, agreement);
      compare_rows(logits, bf16_attention.forward(prompt, true), config.vocab_size, against_bf16);
      std::cout << "[ measure ] FP8 prompt attention, head_dim " << config.head_dim << ", "
                << (layer_major ? "layer by layer" : "chunked") << ": relative L2 "
                << agreement.worst_relative_l2 << " of the CPU, argmax " << agreement.argmax_matches
                << "/" << agreement.rows << "; vs bf16 attention " << against_bf16.worst_relative_l2
                << "\n";
      EXPECT_LE(agreement.worst_relative_l2, 0.1);
      EXPECT_GE(agreement.argmax_matches, 0.9 * agreement.rows);
      EXPECT_GT(against_bf16.worst_relative_l2, 0.0);
    }
  }
}

// On a Hopper build both variants (head_dim 64 and 128) run their sparse prompt attention in FP8
// when asked to (PromptAttention::kFp8: flash_prefill_block_sparse_fp8); it must then differ from
// bf16 prompt attention over the same cache (the kernel is applied) and read the same keys.
TEST(CudaFp8KvCacheModel, SparsePrefillMatchesTheCpuReference) {
  ENTROPYINFER_REQUIRE_GPU();
  for (const int variant : {0, 1}) {
    const ModelConfig config = small_config(variant);
    const ModelWeights weights = gpu_exact_model(config, 21);
    const bool fp8_attention = cuda::fp8_attention_available();
    for (PrefillMethod method : {PrefillMethod::kEntropy, PrefillMethod::kCritiPrefill}) {
      SCOPED_TRACE(std::string(prefill_method_name(method)) + ", variant " +
                   std::to_string(variant));
      const AttentionConfig attention = small_sparse(method);
      Transformer cpu_model(weights, 1024, attention, true);
      cuda::CudaModelOptions options;
      options.context_length = 1024;
      options.attention = attention;
      options.fp8_kv_cache = true;
      if (fp8_attention) options.prompt_attention = cuda::CudaModelOptions::PromptAttention::kFp8;
      cuda::CudaTransformer gpu_model(weights, options);
      EXPECT_EQ(gpu_model.memory_plan().fp8_prompt_attention, fp8_attention);
      const auto prompt = test_prompt(900, config.vocab_size);
      Agreement agreement;
      const auto logits = gpu_model.forward(prompt, true);
      compare_rows(logits, cpu_model.forward(prompt, true), config.vocab_size, agreement);
      const auto& gpu_work = gpu_model.attention_work();
      const auto& cpu_work = cpu_model.attention_work();
      const double gpu_fraction =
          static_cast<double>(gpu_work.prefill_keys_read) / gpu_work.prefill_keys_dense;
      const double cpu_fraction =
          static_cast<double>(cpu_work.prefill_keys_read) / cpu_work.prefill_keys_dense;
      std::cout << "[ measure ] FP8 cache, " << prefill_method_name(method) << ", variant "
                << variant << (fp8_attention ? " (FP8 prompt attention)" : "") << ": relative L2 "
                << agreement.worst_relative_l2 << ", keys read GPU " << gpu_fraction << " CPU "
                << cpu_fraction << "\n";
      EXPECT_LT(gpu_fraction, 0.9);
      EXPECT_NEAR(gpu_fraction, cpu_fraction, 0.02 * cpu_fraction);
      EXPECT_LE(agreement.worst_relative_l2, 0.15);
      if (fp8_attention) {
        options.prompt_attention = cuda::CudaModelOptions::PromptAttention::kBf16;
        cuda::CudaTransformer bf16_attention(weights, options);
        Agreement against_bf16;
        compare_rows(logits, bf16_attention.forward(prompt, true), config.vocab_size, against_bf16);
        std::cout << "[ measure ]   vs bf16 sparse prompt attention: relative L2 "
                  << against_bf16.worst_relative_l2 << "\n";
        EXPECT_GT(against_bf16.worst_relative_l2, 0.0);
        EXPECT_EQ(bf16_attention.attention_work().prefill_keys_read, gpu_work.prefill_keys_read);
      }
    }
  }
}

TEST(CudaFp8KvCacheModel, DecodeCompressionMatchesTheCpuReference) {
  ENTROPYINFER_REQUIRE_GPU();
  const ModelConfig config = small_config(0);
  const ModelWeights weights = gpu_exact_model(config, 31);
  const auto prompt = test_prompt(600, config.vocab_size);
  for (DecodeMethod method : {DecodeMethod::kLatent, DecodeMethod::kSnapKV, DecodeMethod::kAdaKV,
                              DecodeMethod::kStreamingLLM, DecodeMethod::kPyramidKV}) {
    for (bool per_query_head : {false, true}) {
      if (per_query_head && method != DecodeMethod::kLatent) continue;
      SCOPED_TRACE(decode_method_name(method) + (per_query_head ? " per query head" : ""));
      AttentionConfig attention = small_sparse(PrefillMethod::kEntropy);
      attention.decode = method;
      attention.decode_params.per_query_head = per_query_head;
      Transformer cpu_model(weights, 1024, attention, true);
      cuda::CudaModelOptions options;
      options.context_length = 1024;
      options.attention = attention;
      options.decode_room = 64;
      options.fp8_kv_cache = true;
      // The cache's compression alone, under this file's bound for the cache: FP8 prompt
      // attention (its own tests above) would add its rounding to every row.
      options.prompt_attention = cuda::CudaModelOptions::PromptAttention::kBf16;
      cuda::CudaTransformer gpu_model(weights, options);
      const size_t full_bytes = gpu_model.kv_cache_bytes();
      Agreement agreement;
      std::vector<float> cpu_logits = cpu_model.forward(prompt);
      compare_rows(gpu_model.forward(prompt), cpu_logits, config.vocab_size, agreement);
      for (int step = 0; step < 24; ++step) {
        const int32_t token = static_cast<int32_t>(
            std::max_element(cpu_logits.begin(), cpu_logits.end()) - cpu_logits.begin());
        const std::vector<int32_t> one = {token};
        cpu_logits = cpu_model.forward(one);
        compare_rows(gpu_model.forward(one), cpu_logits, config.vocab_size, agreement);
      }
      const auto& gpu_work = gpu_model.attention_work();
      const auto& cpu_work = cpu_model.attention_work();
      std::cout << "[ measure ] FP8 cache, " << decode_method_name(method)
                << (per_query_head ? " (per query head)" : "") << ": relative L2 "
                << agreement.worst_relative_l2 << ", argmax " << agreement.argmax_matches << "/"
                << agreement.rows << ", entries " << gpu_work.cache_entries_after << " (CPU "
                << cpu_work.cache_entries_after << "), cache bytes " << full_bytes << " -> "
                << gpu_model.kv_cache_bytes() << "\n";
      ASSERT_TRUE(gpu_work.compressed);
      EXPECT_EQ(gpu_work.cache_entries_after, cpu_work.cache_entries_after);
      EXPECT_LT(gpu_model.kv_cache_bytes(), full_bytes);
      EXPECT_LE(agreement.worst_relative_l2, kMaxRelativeL2);
      EXPECT_GE(agreement.argmax_matches, 0.9 * agreement.rows);

      gpu_model.reset();
      EXPECT_EQ(gpu_model.kv_cache_bytes(), full_bytes);
      cpu_model.reset();
      Agreement again;
      compare_rows(gpu_model.forward(prompt), cpu_model.forward(prompt), config.vocab_size, again);
      EXPECT_LE(again.worst_relative_l2, kMaxRelativeL2);
    }
  }
}

TEST(CudaFp8KvCacheModel, RefusesCompressingDuringThePrefill) {
  ENTROPYINFER_REQUIRE_GPU();
  const ModelConfig config = small_config(0);
  const ModelWeights weights = gpu_exact_model(config, 41);
  cuda::CudaModelOptions options;
  options.context_length = 512;
  options.attention.decode = DecodeMethod::kSnapKV;
  options.compress_during_prefill = true;
  options.fp8_kv_cache = true;
  EXPECT_THROW(cuda::CudaTransformer(weights, options), Error);
}

}  // namespace
}  // namespace entropyinfer
