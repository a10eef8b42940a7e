// `entropyinfer serve`: an OpenAI-compatible HTTP server over the batch executor. Loads the model
// and tokenizer, builds the batch model and its scheduler, and serves until SIGTERM or SIGINT.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "apps/entropyinfer/attention_options.h"
#include "apps/entropyinfer/cli_common.h"
#include "apps/entropyinfer/commands.h"
#include "apps/entropyinfer/flag_checks.h"
#include "apps/entropyinfer/model_commands.h"
#include "core/error.h"
#include "engine/batch_model.h"
#include "serve/http_server.h"
#include "serve/scheduler.h"
#include "tokenizer/chat_format.h"

namespace entropyinfer::cli {
namespace {

struct ServeArgs {
  std::string model;
  std::string tokenizer;
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;
  std::string chat_format;
  int context = 0;
  int64_t kv_pool_mib = 0;
  int max_running = serve::SchedulerOptions{}.max_running;
  int max_queued = serve::SchedulerOptions{}.max_queued;
  int64_t prefill_budget = serve::SchedulerOptions{}.prefill_token_layers_per_step;
  int64_t prefill_budget_decoding = serve::SchedulerOptions{}.prefill_token_layers_while_decoding;
  int decode_wait_steps = serve::SchedulerOptions{}.decode_wait_steps;
  int decode_wait_batch = serve::SchedulerOptions{}.decode_wait_batch;
  int64_t max_body_bytes = serve::ServeConfig{}.max_body_bytes;
  int http_threads = serve::ServeConfig{}.http_threads;
  AttentionOptions attention;
  DeviceFlags device;
};

// What requests call the model: the folder's name (a checkpoint file's, without its extension).
std::string model_id_of(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path model(path);
  if (!model.has_filename()) model = model.parent_path();  // "models/x/"
  std::error_code error;
  const std::string name =
      fs::is_directory(model, error) ? model.filename().string() : model.stem().string();
  return name.empty() ? "model" : name;
}

// The chat style from --chat-format or the model's template; none when the model has no
// template and no format was asked for (chat completions are then refused with a 400).
std::optional<ChatStyle> chat_style_for(const ServeArgs& args, const Tokenizer& tokenizer) {
  if (!args.chat_format.empty()) {
    return adapt_chat_style_to_tokenizer(select_chat_style(args.model, args.chat_format),
                                         tokenizer);
  }
  try {
    return adapt_chat_style_to_tokenizer(select_chat_style(args.model), tokenizer);
  } catch (const Error& error) {
    std::fprintf(stderr, "chat completions are off: %s (--chat-format NAME switches them on)\n",
                 error.what());
    return std::nullopt;
  }
}

void run_serve(CLI::App* command, const ServeArgs& args) {
  // The batch model prefills in slices budgeted per step; it has no token chunks to size.
  reject_flags(command, {"--chunk"},
               "serve's batch executor prefills in budgeted slices (--prefill-budget), not chunks");
  args.device.check();
  args.device.apply_threads();
  const AttentionConfig attention = args.attention.resolve();

  serve::ServeConfig config;
  config.host = args.host;
  config.port = args.port;
  config.api_key = args.api_key;
  if (config.api_key.empty()) {
    // The environment keeps the key out of `ps`.
    if (const char* key = std::getenv("ENTROPYINFER_API_KEY")) config.api_key = key;
  }
  config.model_id = model_id_of(args.model);
  config.default_attention = attention;
  config.max_body_bytes = args.max_body_bytes;
  config.http_threads = args.http_threads;

  // Declared before the scheduler, which reads both until it is destroyed.
  ModelWeights weights = args.device.load(args.model);
  const std::unique_ptr<Tokenizer> tokenizer = find_tokenizer(args.model, args.tokenizer);
  config.chat_style = chat_style_for(args, *tokenizer);
  config.stop_token_ids = stop_token_ids(weights.config, *tokenizer);

  BatchModelOptions model_options;
  model_options.device = parse_device(args.device.device);
  model_options.context_length = args.context;
  model_options.pool_bytes = args.kv_pool_mib * 1048576;
  model_options.fp8_kv_cache = args.device.fp8_kv_cache();
  model_options.prompt_attention = parse_prompt_attention(args.device.prompt_attention);
  serve::SchedulerOptions scheduler_options;
  scheduler_options.max_running = args.max_running;
  scheduler_options.max_queued = args.max_queued;
  scheduler_options.prefill_token_layers_per_step = args.prefill_budget;
  scheduler_options.prefill_token_layers_while_decoding = args.prefill_budget_decoding;
  scheduler_options.decode_wait_steps = args.decode_wait_steps;
  scheduler_options.decode_wait_batch = args.decode_wait_batch;
  serve::Scheduler scheduler(make_batch_model(weights, model_options), *tokenizer,
                             scheduler_options);

  const ModelConfig& model = scheduler.model_config();
  const KvPoolUsage pool = scheduler.snapshot().pool;
  std::fprintf(
      stderr,
      "serving '%s' (%s, %d layers, %d/%d heads) on %s | context %d tokens | KV pool "
      "%lld pages of %lld bytes (%.1f MiB)%s | chat: %s | default attention %s+%s%s\n",
      config.model_id.c_str(), model.architecture.c_str(), model.num_layers, model.num_heads,
      model.num_kv_heads, scheduler.device_name().c_str(), scheduler.context_length(),
      static_cast<long long>(pool.pages_total), static_cast<long long>(pool.page_bytes),
      static_cast<double>(pool.pages_total) * static_cast<double>(pool.page_bytes) / 1048576.0,
      args.device.fp8_kv_cache() ? ", KV cache fp8 (E4M3, one scale per row)" : "",
      config.chat_style ? std::string(chat_format_name(config.chat_style->format)).c_str() : "off",
      prefill_method_name(attention.prefill).c_str(), decode_method_name(attention.decode).c_str(),
      config.api_key.empty() ? "" : " | API key required");
  serve::run_http_server(scheduler, *tokenizer, config);
}

}  // namespace

void register_serve(CLI::App& app) {
  auto args = std::make_shared<ServeArgs>();
  CLI::App* command =
      app.add_subcommand("serve", "Serve the model over HTTP (OpenAI-compatible API, chat page)");
  command
      ->add_option("-m,--model", args->model,
                   "Hugging Face model folder or llama2.c checkpoint (.bin)")
      ->required();
  command->add_option(
      "--tokenizer", args->tokenizer,
      "Tokenizer file (default: the model folder's own, or tok*.bin beside a .bin)");
  command->add_option("--host", args->host, "Address to listen on")->capture_default_str();
  command->add_option("--port", args->port, "Port to listen on (0: any free port)")
      ->check(integer_in(0, 65535))
      ->capture_default_str();
  command->add_option("--api-key", args->api_key,
                      "Require 'Authorization: Bearer KEY' (default: $ENTROPYINFER_API_KEY, "
                      "else none)");
  command->add_option("--chat-format", args->chat_format,
                      "Chat format instead of the one recognised in tokenizer_config.json "
                      "(llama3, chatml, qwen3, mistral, mistral-v1, llama2)");
  command
      ->add_option("-c,--context", args->context,
                   "Context length per sequence in tokens (default: the model's maximum)")
      ->check(integer_in(0, kMaxTokenCount));
  command
      ->add_option("--kv-pool-mib", args->kv_pool_mib,
                   "KV cache pool shared by all sequences, MiB (default: one full-context "
                   "sequence on the CPU, the memory left after the model on CUDA)")
      ->check(integer_in(0, int64_t{1} << 30));
  command->add_option("--max-running", args->max_running, "Sequences decoding at once")
      ->check(integer_in(1, 1 << 20))
      ->capture_default_str();
  command
      ->add_option("--prefill-budget", args->prefill_budget,
                   "Prefill work per step while nothing decodes, in token-layers (one prompt "
                   "token through one layer)")
      ->check(integer_in(1, int64_t{1} << 40))
      ->capture_default_str();
  command
      ->add_option("--prefill-budget-decoding", args->prefill_budget_decoding,
                   "Prefill work per step while other sequences decode: smaller keeps their "
                   "inter-token latency down, larger finishes long prompts sooner")
      ->check(integer_in(1, int64_t{1} << 40))
      ->capture_default_str();
  command
      ->add_option("--decode-wait-steps", args->decode_wait_steps,
                   "While a prompt prefills, a decode batch smaller than --decode-wait-batch "
                   "sits out up to this many prefill steps between tokens, so that answers share "
                   "weight reads (0: decode at every step)")
      ->check(integer_in(0, 1 << 20))
      ->capture_default_str();
  command
      ->add_option("--decode-wait-batch", args->decode_wait_batch,
                   "Decode batches at least this large never wait for a prefill")
      ->check(integer_in(1, 1 << 20))
      ->capture_default_str();
  command
      ->add_option("--max-queued", args->max_queued,
                   "Requests waiting for admission; beyond it requests get 503")
      ->check(integer_in(0, 1 << 20))
      ->capture_default_str();
  command
      ->add_option("--max-body-bytes", args->max_body_bytes,
                   "Largest request body; larger ones get 413")
      ->check(integer_in(1024, int64_t{1} << 32))
      ->capture_default_str();
  command
      ->add_option("--http-threads", args->http_threads,
                   "Connections served at once (a streamed answer holds one)")
      ->check(integer_in(1, 4096))
      ->capture_default_str();
  args->attention.add_to(command);
  args->device.add_to(command);
  command->callback([command, args] { run_serve(command, *args); });
}

}  // namespace entropyinfer::cli
