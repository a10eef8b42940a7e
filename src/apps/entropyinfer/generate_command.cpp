// `entropyinfer generate`: load a model, tokenize the prompt (optionally as a chat), stream the
// continuation, and end with a timing summary.
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <memory>

#include "apps/entropyinfer/attention_options.h"
#include "apps/entropyinfer/cli_common.h"
#include "apps/entropyinfer/commands.h"
#include "apps/entropyinfer/flag_checks.h"
#include "apps/entropyinfer/model_commands.h"
#include "core/error.h"
#include "core/stopwatch.h"
#include "engine/generation.h"
#include "engine/language_model.h"
#include "tokenizer/chat_format.h"

namespace entropyinfer::cli {
namespace {

struct GenerateArgs {
  std::string model;
  std::string tokenizer;
  std::string prompt;
  std::string prompt_file;
  int max_tokens = 256;
  int context = 0;
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint64_t seed = 0;
  std::string sampler = "standard";
  std::vector<std::string> stop;
  bool no_bos = false;
  bool ignore_eos = false;
  bool quiet = false;
  bool chat = false;
  std::string system;
  std::string chat_format;
  bool no_think = false;
  AttentionOptions attention;
  DeviceFlags device;
};

void run_generate(const GenerateArgs& args) {
  SamplerOptions sampler;
  sampler.temperature = args.temperature;
  sampler.top_k = args.top_k;
  sampler.top_p = args.top_p;
  sampler.seed = args.seed;
  sampler.presence_penalty = args.presence_penalty;
  sampler.frequency_penalty = args.frequency_penalty;
  sampler.mode = args.sampler == "llama2c" ? SamplerMode::kLlama2c : SamplerMode::kStandard;
  validate_sampler_options(sampler);
  args.device.check();
  args.device.apply_threads();

  const AttentionConfig attention = args.attention.resolve();
  const std::string prompt_text = read_prompt(args.prompt, args.prompt_file);
  const auto load_start = std::chrono::steady_clock::now();
  ModelWeights weights = args.device.load(args.model);
  const ModelConfig model_config = weights.config;
  std::unique_ptr<Tokenizer> tokenizer = find_tokenizer(args.model, args.tokenizer);

  EncodeOptions encode;
  encode.add_bos = !args.no_bos;
  encode.parse_special = false;
  std::vector<std::string> stop_strings = args.stop;
  std::string text = prompt_text;
  if (args.chat) {
    // The chat text already carries BOS and the turn markup as special tokens.
    const ChatStyle style =
        adapt_chat_style_to_tokenizer(select_chat_style(args.model, args.chat_format), *tokenizer);
    std::vector<ChatMessage> messages;
    if (!args.system.empty()) messages.push_back({"system", args.system});
    messages.push_back({"user", prompt_text});
    ChatOptions chat_options;
    chat_options.enable_thinking = !args.no_think;
    text = format_chat(style, messages, chat_options);
    encode.add_bos = false;
    encode.parse_special = true;
    for (const std::string& stop : chat_stop_strings(style.format)) stop_strings.push_back(stop);
  } else if (!args.system.empty() || !args.chat_format.empty()) {
    throw Error("--system and --chat-format need --chat");
  }
  std::vector<int32_t> prompt = tokenizer->encode(text, encode);
  if (prompt.empty()) {
    throw Error("the prompt encodes to no tokens and the tokenizer has no BOS; give a prompt");
  }

  // The GPU plans its memory up front, so without --context its cache holds this prompt and answer
  // (the CPU's grows on demand up to the model's maximum).
  int context = args.context;
  if (context == 0 && args.device.device == "cuda") {
    context = static_cast<int>(
        std::min<int64_t>(static_cast<int64_t>(prompt.size()) + args.max_tokens, kMaxTokenCount));
    if (model_config.max_position_embeddings > 0)
      context = std::min(context, model_config.max_position_embeddings);
  }
  // Named before open_language_model, which empties the weights when the GPU takes its own copy.
  const std::string fp8_scheme = weights.fp8_scheme;
  const std::unique_ptr<LanguageModel> model = open_language_model(
      args.device, weights, context, attention, /*decode_room=*/std::max(args.max_tokens, 1));
  const double load_seconds = seconds_since(load_start);
  const auto warm_up_start = std::chrono::steady_clock::now();
  model->warm_up();
  const double warm_up_seconds = seconds_since(warm_up_start);
  if (!args.quiet) {
    const std::string fp8_weights = fp8_scheme.empty() ? "" : " | FP8 weights: " + fp8_scheme;
    const std::string fp8_cache =
        args.device.fp8_kv_cache() ? " | KV cache fp8 (E4M3, one scale per row)" : "";
    std::fprintf(stderr,
                 "model ready in %.2f s (weights loaded in %.2f s, warm-up %.2f s) | host "
                 "anonymous memory %.0f MiB%s%s\n",
                 load_seconds + warm_up_seconds, load_seconds, warm_up_seconds,
                 resident_anonymous_mib(), fp8_weights.c_str(), fp8_cache.c_str());
  }
  if (static_cast<int64_t>(prompt.size()) > model->context_length()) {
    throw Error("the prompt has " + std::to_string(prompt.size()) + " tokens, more than the " +
                std::to_string(model->context_length()) + "-token context");
  }
  if (prompt.size() > 1024) {
    model->set_progress_callback(prefill_progress_printer());
  }

  GenerationOptions options;
  options.max_tokens =
      std::min<int>(args.max_tokens, model->context_length() - static_cast<int>(prompt.size()));
  options.sampler = sampler;
  if (!args.ignore_eos) options.stop_token_ids = stop_token_ids(model_config, *tokenizer);
  options.stop_strings = stop_strings;

  // Like llama.cpp, show a plain prompt before its continuation (a chat shows only the answer).
  if (!args.chat) {
    std::fwrite(prompt_text.data(), 1, prompt_text.size(), stdout);
    std::fflush(stdout);
  }
  const GenerationResult result =
      generate(*model, *tokenizer, prompt, options, [](std::string_view piece) {
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
      });
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (!args.quiet) {
    std::fprintf(stderr,
                 "\nprompt tokens: %d | prefill: %.3f s (%.1f tokens/s) | generated: %zu tokens, "
                 "decode %.1f tokens/s | end to end %.3f s | stop: %s | KV cache %.1f MiB | peak "
                 "memory %.1f MiB "
                 "(anonymous now %.0f MiB) | %s\n",
                 result.prompt_tokens, result.prefill_seconds,
                 result.prompt_tokens / std::max(result.prefill_seconds, 1e-9),
                 result.tokens.size(), result.decode_steps / std::max(result.decode_seconds, 1e-9),
                 result.prefill_seconds + result.decode_seconds, result.stop_reason.c_str(),
                 model->kv_cache_bytes() / 1048576.0, peak_resident_mib(), resident_anonymous_mib(),
                 model->device_name().c_str());
    if (attention.prefill != PrefillMethod::kFull || attention.decode != DecodeMethod::kFull) {
      std::fprintf(stderr, "%s\n",
                   describe_attention_work(attention, model->attention_work()).c_str());
    }
  }
}

}  // namespace

void register_generate(CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* command = app.add_subcommand("generate", "Generate text from a prompt");
  command
      ->add_option("-m,--model", args->model,
                   "Hugging Face model folder or llama2.c checkpoint (.bin)")
      ->required();
  command->add_option(
      "--tokenizer", args->tokenizer,
      "Tokenizer file (default: the model folder's own, or tok*.bin beside a .bin)");
  command->add_option("-p,--prompt", args->prompt, "Prompt text");
  command->add_option("-f,--prompt-file", args->prompt_file, "Read the prompt from a file");
  command->add_option("-n,--max-tokens", args->max_tokens, "Most tokens to generate")
      ->check(integer_in(0, kMaxTokenCount))
      ->capture_default_str();
  command
      ->add_option("-c,--context", args->context,
                   "Context length in tokens (default: the model's maximum; on cuda, the prompt "
                   "plus --max-tokens)")
      ->check(integer_in(0, kMaxTokenCount));
  command->add_option("-t,--temperature", args->temperature, "Sampling temperature; 0 is greedy")
      ->check(number_in(0.0, HUGE_VAL))
      ->capture_default_str();
  command->add_option("--top-k", args->top_k, "Sample among the k most likely tokens (0: all)")
      ->check(integer_in(0, INT32_MAX));
  command->add_option("--top-p", args->top_p, "Nucleus sampling mass (1: off)")
      ->check(number_in(0.0, 1.0))
      ->capture_default_str();
  command
      ->add_option("--presence-penalty", args->presence_penalty,
                   "Subtracted once from the logit of every token already generated")
      ->check(number_in(-kMaxPenalty, kMaxPenalty))
      ->capture_default_str();
  command
      ->add_option("--frequency-penalty", args->frequency_penalty,
                   "Subtracted from a generated token's logit once per time it was generated")
      ->check(number_in(-kMaxPenalty, kMaxPenalty))
      ->capture_default_str();
  command->add_option("-s,--seed", args->seed, "Random seed")
      ->check(seed_value())
      ->capture_default_str();
  command
      ->add_option("--sampler", args->sampler,
                   "standard, or llama2c to reproduce llama2.c's run.c sampling exactly")
      ->check(CLI::IsMember({"standard", "llama2c"}))
      ->capture_default_str();
  command->add_option("--stop", args->stop, "Stop when this text appears (repeatable)");
  command->add_flag("--no-bos", args->no_bos, "Do not prepend the BOS token");
  command->add_flag("--ignore-eos", args->ignore_eos,
                    "Keep generating past end-of-sequence tokens (for timing; stop strings still "
                    "apply)");
  command->add_flag("-q,--quiet", args->quiet, "No timing summary");
  command->add_flag("--chat", args->chat,
                    "Wrap the prompt as a user turn in the model's chat format");
  command->add_option("--system", args->system, "System message for --chat");
  command->add_option("--chat-format", args->chat_format,
                      "Chat format instead of the one recognised in tokenizer_config.json "
                      "(llama3, chatml, qwen3, mistral, mistral-v1, llama2)");
  command->add_flag("--no-think", args->no_think, "Qwen 3: switch thinking off");
  args->attention.add_to(command);
  args->device.add_to(command);
  command->callback([args] { run_generate(*args); });
}

}  // namespace entropyinfer::cli
