// The HTTP side of `entropyinfer serve` (cpp-httplib): OpenAI's /v1/completions and
// /v1/chat/completions, streamed as server-sent events or whole, /v1/models, /health, /metrics
// and the chat page at /. Requests are tokenized here and handed to the Scheduler; every refusal
// is an OpenAI error body, whatever the input.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attention/attention_config.h"
#include "serve/scheduler.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/tokenizer.h"

namespace entropyinfer::serve {

struct ServeConfig {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port (the listening line names it)
  std::string
      api_key;  // non-empty: every route but /health and the page needs it as a Bearer token
  std::string model_id;                 // what requests may name and responses report
  std::optional<ChatStyle> chat_style;  // none: chat completions are refused
  AttentionConfig default_attention;    // what requests' `attention` objects override
  std::vector<int32_t> stop_token_ids;  // the model's end-of-sequence ids
  // A 128k-token prompt is about 0.5 MiB of text; JSON escaping can double it.
  int64_t max_body_bytes = int64_t{8} << 20;
  int http_threads = 64;  // connections served at once (a stream holds one for its duration)
};

// Serves until SIGTERM or SIGINT: then it refuses new requests (503), lets those in flight finish,
// stops the server and returns. Prints "listening on http://HOST:PORT" on stderr once it accepts
// connections. Error when it cannot listen.
void run_http_server(Scheduler& scheduler, const Tokenizer& tokenizer, const ServeConfig& config);

}  // namespace entropyinfer::serve
