#include "serve/http_server.h"

#include <fcntl.h>
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "serve/chat_page.h"
#include "serve/metrics.h"
#include "serve/openai_protocol.h"

namespace entropyinfer::serve {
namespace {

using Clock = std::chrono::steady_clock;
using HandlerResponse = httplib::Server::HandlerResponse;

// How long a stream waits for the scheduler before checking on the client again, and how long
// it stays silent before writing an SSE comment, which is how a client that went away while its
// request waited or prefilled is noticed.
constexpr auto kStreamPoll = std::chrono::milliseconds(100);
constexpr auto kKeepAliveInterval = std::chrono::seconds(1);
// After the scheduler is idle, how long shutdown waits for responses still being written.
constexpr auto kResponseDrainLimit = std::chrono::seconds(30);

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string shorten(std::string_view text) {
  constexpr size_t kMax = 80;
  if (text.size() <= kMax) return std::string(text);
  size_t end = kMax;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  return std::string(text.substr(0, end)) + "...";
}

void respond_json(httplib::Response& res, int status, const nlohmann::json& body) {
  res.status = status;
  res.set_content(dump_json(body), "application/json");
}

void respond_error(httplib::Response& res, const ApiError& error) {
  res.status = error.status;
  res.set_content(error_body(error), "application/json");
}

// Compares in time independent of where the texts differ, so that response times do not leak
// the key.
bool constant_time_equal(std::string_view a, std::string_view b) {
  unsigned char difference = a.size() == b.size() ? 0 : 1;
  const size_t length = std::min(a.size(), b.size());
  for (size_t i = 0; i < length; ++i) {
    difference |= static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return difference == 0;
}

bool starts_with_ignoring_case(std::string_view text, std::string_view prefix) {
  if (text.size() < prefix.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(text[i])) !=
        std::tolower(static_cast<unsigned char>(prefix[i]))) {
      return false;
    }
  }
  return true;
}

// The routes: their names (as /metrics labels them) and the one method each answers.
struct Route {
  const char* label;
  const char* method;
};

const Route* find_route(const std::string& path) {
  static constexpr Route kRoutes[] = {
      {"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"},
      {"/tokenize", "POST"},       {"/detokenize", "POST"},
      {"/v1/models", "GET"},       {"/health", "GET"},
      {"/metrics", "GET"},         {"/", "GET"},
  };
  static constexpr Route kModel = {"/v1/models/{id}", "GET"};
  for (const Route& route : kRoutes) {
    if (path == route.label) return &route;
  }
  constexpr std::string_view kModelsPrefix = "/v1/models/";
  if (path.size() > kModelsPrefix.size() && path.rfind(kModelsPrefix, 0) == 0) return &kModel;
  return nullptr;
}

std::string route_label(const std::string& path) {
  const Route* route = find_route(path);
  return route != nullptr ? route->label : "other";
}

// Counts responses that are still being produced; shutdown waits for it to reach zero.
class InFlight {
 public:
  explicit InFlight(std::atomic<int>& count) : count_(count) { ++count_; }
  ~InFlight() { --count_; }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;

 private:
  std::atomic<int>& count_;
};

// One streamed response, shared by httplib's content provider and its releaser.
struct StreamState {
  std::shared_ptr<RequestStream> stream;
  Endpoint endpoint = Endpoint::kCompletions;
  ResponseIdentity identity;
  bool include_usage = false;
  bool logprobs = false;  // asked: each chunk reports its tokens'
  std::string echo;       // the prompt, sent as the first text chunk
  // Echo with logprobs: the first chunk waits for the prefill, whose first event brings the
  // prompt's scores; these are the tokens they list.
  std::optional<std::vector<int32_t>> scored_prompt;
  bool bos_added = true;    // the server put BOS before a text prompt (prompt_logprobs_json)
  int64_t text_offset = 0;  // completions' text_offset of the next token
  bool role_sent = false;
  bool finished = false;
  Clock::time_point start;
  Clock::time_point last_write;
  std::atomic<bool> released{false};
  std::unique_ptr<InFlight> in_flight;
};

// The self-pipe that carries SIGTERM and SIGINT from the signal handler to the shutdown thread.
int g_signal_pipe_write = -1;

void on_shutdown_signal(int) {
  const char byte = 's';
  // Nothing else is safe here; a full pipe means a shutdown is already pending.
  [[maybe_unused]] const ssize_t written = ::write(g_signal_pipe_write, &byte, 1);
}

class FrontEnd {
 public:
  FrontEnd(Scheduler& scheduler, const Tokenizer& tokenizer, const ServeConfig& config)
      : scheduler_(scheduler),
        tokenizer_(tokenizer),
        config_(config),
        // The scheduler samples over the tokenizer's ids, so those are what logit_bias may name.
        served_{config.model_id, config.default_attention, std::max(tokenizer.vocab_size(), 0),
                // A prompt's ids must have an embedding row and text.
                std::max(std::min(tokenizer.vocab_size(), scheduler.model_config().vocab_size), 0)},
        started_(std::chrono::duration_cast<std::chrono::seconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count()) {}

  void run();

 private:
  void install_routes();
  bool authorized(const httplib::Request& req) const;
  bool needs_key(const httplib::Request& req) const;
  void respond_unauthorized(httplib::Response& res) const;
  HandlerResponse before_routing(const httplib::Request& req, httplib::Response& res) const;
  HandlerResponse on_error(const httplib::Request& req, httplib::Response& res) const;
  void on_exception(httplib::Response& res, std::exception_ptr exception) const;

  void handle_generation(Endpoint endpoint, const httplib::Request& req, httplib::Response& res);
  std::vector<int32_t> tokenize(const CompletionRequest& request) const;
  // What echo puts before the answer: the prompt's text, or a token-id prompt's ids decoded.
  std::string echo_text(const CompletionRequest& request) const;
  std::shared_ptr<RequestStream> submit(SequenceRequest sequence) const;
  // scored_prompt: the prompt's tokens when echo with logprobs scores them, else empty.
  void answer_whole(const CompletionRequest& request, std::span<const int32_t> scored_prompt,
                    std::shared_ptr<RequestStream> stream, Clock::time_point start,
                    httplib::Response& res);
  void answer_streamed(const CompletionRequest& request, std::vector<int32_t> scored_prompt,
                       std::shared_ptr<RequestStream> stream, Clock::time_point start,
                       std::unique_ptr<InFlight> in_flight, httplib::Response& res);
  bool write_stream(StreamState& state, httplib::DataSink& sink);
  void record_outcome(const StreamEvent& finished, Clock::time_point start);

  void shutdown_on_signal(int signal_pipe_read);

  Scheduler& scheduler_;
  const Tokenizer& tokenizer_;
  const ServeConfig& config_;
  const ServedModel served_;
  const int64_t started_;
  ServerMetrics metrics_;
  httplib::Server server_;
  std::atomic<int> responses_in_flight_{0};
  std::atomic<bool> listening_done_{false};
};

bool FrontEnd::authorized(const httplib::Request& req) const {
  if (config_.api_key.empty()) return true;
  const std::string header = req.get_header_value("Authorization");
  constexpr std::string_view kScheme = "Bearer ";
  if (!starts_with_ignoring_case(header, kScheme)) return false;
  return constant_time_equal(std::string_view(header).substr(kScheme.size()), config_.api_key);
}

// /health is for load balancers and the page is static text (it asks for the key itself): both
// are open. Everything else needs the key.
bool FrontEnd::needs_key(const httplib::Request& req) const {
  if (config_.api_key.empty()) return false;
  const bool page = req.path == "/" && (req.method == "GET" || req.method == "HEAD");
  return !(req.path == "/health" || page);
}

void FrontEnd::respond_unauthorized(httplib::Response& res) const {
  res.set_header("WWW-Authenticate", "Bearer");
  respond_error(res, ApiError(401, "authentication_error",
                              "missing or invalid API key: send the header 'Authorization: "
                              "Bearer KEY' with the key the server was started with",
                              {}, "invalid_api_key"));
}

HandlerResponse FrontEnd::before_routing(const httplib::Request& req,
                                         httplib::Response& res) const {
  // cpp-httplib reads chunked, compressed and length-less bodies without the size limit: such
  // bodies are refused before they are read, and the client is told to close the connection,
  // on which they stay unread.
  const std::string transfer_encoding = req.get_header_value("Transfer-Encoding");
  const std::string content_encoding = req.get_header_value("Content-Encoding");
  const bool has_length = req.has_header("Content-Length");
  const bool sends_body = req.method == "POST" || req.method == "PUT" || req.method == "PATCH";
  if (!transfer_encoding.empty() || (sends_body && !has_length)) {
    res.set_header("Connection", "close");
    respond_error(res, ApiError(411, "invalid_request_error",
                                "send the request body with a Content-Length header (chunked "
                                "or unbounded bodies are not accepted)"));
    return HandlerResponse::Handled;
  }
  if (!content_encoding.empty() && content_encoding != "identity") {
    res.set_header("Connection", "close");
    respond_error(res, ApiError(415, "invalid_request_error",
                                "compressed request bodies (Content-Encoding: " +
                                    shorten(content_encoding) + ") are not accepted"));
    return HandlerResponse::Handled;
  }
  // A request with a body is refused after httplib has read it (within the limit), so that the
  // connection stays usable; the handlers check the key before anything else.
  const std::string length = req.get_header_value("Content-Length");
  const bool body_follows = has_length && length.find_first_not_of("0") != std::string::npos;
  if (needs_key(req) && !body_follows && !authorized(req)) {
    respond_unauthorized(res);
    return HandlerResponse::Handled;
  }
  return HandlerResponse::Unhandled;
}

HandlerResponse FrontEnd::on_error(const httplib::Request& req, httplib::Response& res) const {
  // A handler's own error body stays.
  if (!res.body.empty()) return HandlerResponse::Unhandled;
  const std::string method = shorten(req.method);
  const std::string path = shorten(req.path);
  switch (res.status) {
    case 404:
      if (needs_key(req) && !authorized(req)) {
        respond_unauthorized(res);
      } else if (const Route* route = find_route(req.path)) {
        res.set_header("Allow", route->method);
        respond_error(
            res, ApiError(405, "invalid_request_error",
                          method + " is not allowed on " + route->label + "; use " + route->method,
                          {}, "method_not_allowed"));
      } else {
        respond_error(res, ApiError(404, "not_found_error",
                                    "no route for " + method + " " + path +
                                        " (routes: POST /v1/completions, POST "
                                        "/v1/chat/completions, POST /tokenize, POST /detokenize, "
                                        "GET /v1/models, GET /health, GET /metrics, GET /)",
                                    {}, "unknown_route"));
      }
      break;
    case 413:
      if (req.get_header_value("Content-Type").rfind("application/x-www-form-urlencoded", 0) == 0) {
        // cpp-httplib's own limit for form bodies, which is what `curl -d` sends by default.
        respond_error(res,
                      ApiError(413, "invalid_request_error",
                               "form-encoded request bodies are limited to " +
                                   std::to_string(CPPHTTPLIB_FORM_URL_ENCODED_PAYLOAD_MAX_LENGTH) +
                                   " bytes; send the JSON with 'Content-Type: "
                                   "application/json'",
                               {}, "request_too_large"));
      } else {
        respond_error(res, ApiError(413, "invalid_request_error",
                                    "the request body is larger than the server's limit of " +
                                        std::to_string(config_.max_body_bytes) + " bytes",
                                    {}, "request_too_large"));
      }
      break;
    case 414:
      respond_error(res, ApiError(414, "invalid_request_error", "the request URI is too long"));
      break;
    case 400:
      respond_error(res,
                    ApiError(400, "invalid_request_error",
                             "malformed HTTP request (request line, headers or body framing)"));
      break;
    default:
      respond_error(
          res, ApiError(res.status, res.status >= 500 ? "server_error" : "invalid_request_error",
                        "the request failed with HTTP status " + std::to_string(res.status)));
      break;
  }
  return HandlerResponse::Handled;
}

void FrontEnd::on_exception(httplib::Response& res, std::exception_ptr exception) const {
  try {
    std::rethrow_exception(exception);
  } catch (const ApiError& error) {
    respond_error(res, error);
  } catch (const std::bad_alloc&) {
    respond_error(res, ApiError(500, "server_error", "the server ran out of memory"));
  } catch (const std::exception& error) {
    respond_error(res, ApiError(500, "server_error",
                                std::string("internal error: ") + shorten(error.what())));
  } catch (...) {
    respond_error(res, ApiError(500, "server_error", "internal error"));
  }
}

std::vector<int32_t> FrontEnd::tokenize(const CompletionRequest& request) const {
  // As vLLM does: token ids are the prompt exactly, with no BOS added.
  if (request.prompt_token_ids) return *request.prompt_token_ids;
  if (request.endpoint == Endpoint::kCompletions) {
    // As `generate` does: BOS, then the text with no special-token parsing.
    return tokenizer_.encode(request.prompt, {.add_bos = true, .parse_special = false});
  }
  if (!config_.chat_style) {
    throw ApiError(400, "invalid_request_error",
                   "this model has no chat template, so chat completions are not available; "
                   "start the server with --chat-format NAME (llama3, chatml, qwen3, mistral, "
                   "mistral-v1, llama2) or use /v1/completions",
                   "messages", "no_chat_template");
  }
  std::string text;
  try {
    text = format_chat(*config_.chat_style, request.messages);
  } catch (const Error& error) {
    throw invalid_request(error.what(), "messages");
  }
  // The chat text carries BOS and the turn markup as special tokens.
  return tokenizer_.encode(text, {.add_bos = false, .parse_special = true});
}

std::string FrontEnd::echo_text(const CompletionRequest& request) const {
  return request.prompt_token_ids ? tokenizer_.decode(*request.prompt_token_ids) : request.prompt;
}

std::shared_ptr<RequestStream> FrontEnd::submit(SequenceRequest sequence) const {
  try {
    return scheduler_.submit(std::move(sequence));
  } catch (const QueueFullError& error) {
    throw ApiError(503, "server_error", error.what(), {}, "queue_full");
  } catch (const AdmissionError& error) {
    throw invalid_request(error.what(), {}, "kv_pool_exceeded");
  } catch (const Error& error) {
    if (!scheduler_.snapshot().accepting) {
      throw ApiError(503, "server_error", "the server is shutting down", {}, "shutting_down");
    }
    throw invalid_request(error.what());
  }
}

void FrontEnd::handle_generation(Endpoint endpoint, const httplib::Request& req,
                                 httplib::Response& res) {
  const Clock::time_point start = Clock::now();
  // Nothing of an unauthenticated request is parsed.
  if (needs_key(req) && !authorized(req)) {
    respond_unauthorized(res);
    return;
  }
  auto in_flight = std::make_unique<InFlight>(responses_in_flight_);
  try {
    if (!scheduler_.snapshot().accepting) {
      throw ApiError(503, "server_error", "the server is shutting down", {}, "shutting_down");
    }
    const CompletionRequest request = parse_completion_request(endpoint, req.body, served_);
    SequenceRequest sequence;
    sequence.prompt = tokenize(request);
    if (sequence.prompt.empty()) {
      throw invalid_request("the prompt encodes to no tokens and the tokenizer has no BOS",
                            "prompt");
    }
    GenerationOptions& generation = sequence.generation;
    generation.max_tokens = resolve_max_tokens(
        request, static_cast<int64_t>(sequence.prompt.size()), scheduler_.context_length());
    generation.sampler = request.sampler;
    if (request.seed) {
      generation.sampler.seed = *request.seed;
    } else {
      thread_local std::mt19937_64 seeds{std::random_device{}()};
      generation.sampler.seed = seeds();
    }
    generation.stop_token_ids = config_.stop_token_ids;
    generation.stop_strings = request.stop;
    if (endpoint == Endpoint::kChatCompletions) {
      for (std::string& stop : chat_stop_strings(config_.chat_style->format)) {
        generation.stop_strings.push_back(std::move(stop));
      }
    }
    sequence.attention = request.attention;
    sequence.top_logprobs = request.top_logprobs.value_or(-1);
    std::vector<int32_t> scored_prompt;
    if (request.echo && request.top_logprobs) {
      sequence.prompt_logprobs = *request.top_logprobs;
      scored_prompt = sequence.prompt;
    }
    std::shared_ptr<RequestStream> stream = submit(std::move(sequence));
    if (request.stream) {
      answer_streamed(request, std::move(scored_prompt), std::move(stream), start,
                      std::move(in_flight), res);
    } else {
      answer_whole(request, scored_prompt, std::move(stream), start, res);
    }
  } catch (const ApiError& error) {
    respond_error(res, error);
  }
}

void FrontEnd::record_outcome(const StreamEvent& finished, Clock::time_point start) {
  switch (finished.finish_reason) {
    case FinishReason::kStop:
    case FinishReason::kLength:
      metrics_.observe_generation(finished.stats, seconds_since(start));
      break;
    case FinishReason::kCancelled:
      metrics_.count_unfinished("cancelled");
      break;
    case FinishReason::kError:
      metrics_.count_unfinished("error");
      break;
  }
}

void FrontEnd::answer_whole(const CompletionRequest& request,
                            std::span<const int32_t> scored_prompt,
                            std::shared_ptr<RequestStream> stream, Clock::time_point start,
                            httplib::Response& res) {
  const std::string echoed = request.echo ? echo_text(request) : std::string();
  std::string text = echoed;
  std::vector<TokenLogprob> logprobs, prompt_logprobs;
  StreamEvent event;
  for (;;) {
    if (!stream->next(event, std::chrono::seconds(1))) continue;
    logprobs.insert(logprobs.end(), event.logprobs.begin(), event.logprobs.end());
    prompt_logprobs.insert(prompt_logprobs.end(), event.prompt_logprobs.begin(),
                           event.prompt_logprobs.end());
    if (event.kind == StreamEvent::Kind::kText) {
      text += event.text;
      continue;
    }
    break;
  }
  record_outcome(event, start);
  if (event.finish_reason == FinishReason::kError) {
    throw ApiError(500, "server_error", "generation failed: " + event.error, {}, "engine_error");
  }
  if (event.finish_reason == FinishReason::kCancelled) {
    throw ApiError(503, "server_error", "the request was cancelled: the server is stopping", {},
                   "cancelled");
  }
  const ResponseIdentity identity = new_response_identity(request.endpoint, request.model);
  nlohmann::json logprobs_object = nullptr;
  if (request.top_logprobs) {
    int64_t text_offset = 0;
    if (!scored_prompt.empty()) {
      logprobs_object = prompt_logprobs_json(scored_prompt, prompt_logprobs, tokenizer_,
                                             text_offset, !request.prompt_token_ids);
      // The answer's offsets count from the end of the echoed text.
      text_offset = static_cast<int64_t>(echoed.size());
      append_logprobs(logprobs_object,
                      logprobs_json(request.endpoint, logprobs, tokenizer_, text_offset));
    } else {
      logprobs_object = logprobs_json(request.endpoint, logprobs, tokenizer_, text_offset);
    }
  }
  respond_json(
      res, 200,
      completion_response(request.endpoint, identity, text,
                          openai_finish_reason(event.finish_reason), event.stats, logprobs_object));
}

void FrontEnd::answer_streamed(const CompletionRequest& request, std::vector<int32_t> scored_prompt,
                               std::shared_ptr<RequestStream> stream, Clock::time_point start,
                               std::unique_ptr<InFlight> in_flight, httplib::Response& res) {
  auto state = std::make_shared<StreamState>();
  state->stream = std::move(stream);
  state->endpoint = request.endpoint;
  state->identity = new_response_identity(request.endpoint, request.model);
  state->include_usage = request.include_usage;
  state->logprobs = request.top_logprobs.has_value();
  if (request.echo) state->echo = echo_text(request);
  state->bos_added = !request.prompt_token_ids;
  if (!scored_prompt.empty()) state->scored_prompt = std::move(scored_prompt);
  state->start = start;
  state->last_write = Clock::now();
  state->in_flight = std::move(in_flight);
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, state](size_t, httplib::DataSink& sink) {
        // An exception here would escape httplib's worker thread; a failed stream is a closed one.
        try {
          if (write_stream(*state, sink)) return true;
        } catch (...) {
        }
        state->stream->cancel();
        return false;
      },
      [this, state](bool) {
        if (state->released.exchange(true)) return;
        if (!state->finished) {
          // The client went away (or the server stopped) before the end: free its pages.
          state->stream->cancel();
          metrics_.count_unfinished("cancelled");
        }
        state->in_flight.reset();
      });
}

// Writes what is ready; false once the client is gone.
bool FrontEnd::write_stream(StreamState& state, httplib::DataSink& sink) {
  auto send = [&](const std::string& text) {
    if (!sink.write(text.data(), text.size())) return false;
    state.last_write = Clock::now();
    return true;
  };
  if (state.endpoint == Endpoint::kChatCompletions && !state.role_sent) {
    state.role_sent = true;
    return send(sse_event(role_chunk(state.identity, state.include_usage)));
  }
  if (!state.echo.empty() && !state.scored_prompt) {
    const std::string prompt = std::exchange(state.echo, {});
    return send(sse_event(text_chunk(state.endpoint, state.identity, prompt, state.include_usage)));
  }
  StreamEvent event;
  if (!state.stream->next(event, kStreamPoll)) {
    if (Clock::now() - state.last_write >= kKeepAliveInterval) return send(": keep-alive\n\n");
    return sink.is_writable();
  }
  const bool answered = event.kind == StreamEvent::Kind::kText ||
                        event.finish_reason == FinishReason::kStop ||
                        event.finish_reason == FinishReason::kLength;
  if (state.scored_prompt && answered) {
    // The echoed prompt with its scores is the first chunk; the answer's offsets follow its text.
    const std::vector<int32_t> prompt = *std::exchange(state.scored_prompt, std::nullopt);
    int64_t prompt_offset = 0;
    const nlohmann::json scores = prompt_logprobs_json(prompt, event.prompt_logprobs, tokenizer_,
                                                       prompt_offset, state.bos_added);
    const std::string text = std::exchange(state.echo, {});
    state.text_offset = static_cast<int64_t>(text.size());
    if (!send(sse_event(
            text_chunk(state.endpoint, state.identity, text, state.include_usage, scores)))) {
      return false;
    }
  }
  const auto chunk_logprobs = [&] {
    return state.logprobs && (event.kind == StreamEvent::Kind::kText || !event.logprobs.empty())
               ? logprobs_json(state.endpoint, event.logprobs, tokenizer_, state.text_offset)
               : nlohmann::json(nullptr);
  };
  if (event.kind == StreamEvent::Kind::kText) {
    if (event.text.empty()) return true;
    return send(sse_event(text_chunk(state.endpoint, state.identity, event.text,
                                     state.include_usage, chunk_logprobs())));
  }
  state.finished = true;
  record_outcome(event, state.start);
  std::string tail;
  if (event.finish_reason == FinishReason::kError ||
      event.finish_reason == FinishReason::kCancelled) {
    const ApiError error =
        event.finish_reason == FinishReason::kError
            ? ApiError(500, "server_error", "generation failed: " + event.error, {}, "engine_error")
            : ApiError(503, "server_error", "the request was cancelled: the server is stopping", {},
                       "cancelled");
    tail = "data: " + error_body(error) + "\n\n";
  } else {
    const std::string reason = openai_finish_reason(event.finish_reason);
    tail = sse_event(finish_chunk(state.endpoint, state.identity, reason, event.stats,
                                  state.include_usage, chunk_logprobs()));
    if (state.include_usage) {
      tail += sse_event(usage_chunk(state.endpoint, state.identity, event.stats));
    }
  }
  tail += sse_done();
  if (!send(tail)) return false;
  sink.done();
  return true;
}

void FrontEnd::install_routes() {
  server_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generation(Endpoint::kCompletions, req, res);
  });
  server_.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generation(Endpoint::kChatCompletions, req, res);
  });
  // Token counts before sending a long prompt, as vLLM's and llama.cpp's servers offer them.
  server_.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    if (needs_key(req) && !authorized(req)) return respond_unauthorized(res);
    try {
      const std::vector<int32_t> tokens = tokenize(parse_tokenize_request(req.body, served_));
      respond_json(res, 200,
                   {{"count", tokens.size()},
                    {"max_model_len", scheduler_.context_length()},
                    {"tokens", tokens}});
    } catch (const ApiError& error) {
      respond_error(res, error);
    }
  });
  server_.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    if (needs_key(req) && !authorized(req)) return respond_unauthorized(res);
    try {
      respond_json(res, 200,
                   {{"prompt", tokenizer_.decode(parse_detokenize_request(req.body, served_))}});
    } catch (const ApiError& error) {
      respond_error(res, error);
    }
  });
  server_.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    if (needs_key(req) && !authorized(req)) return respond_unauthorized(res);
    respond_json(res, 200, models_list(config_.model_id, started_));
  });
  server_.Get("/v1/models/(.+)", [this](const httplib::Request& req, httplib::Response& res) {
    if (needs_key(req) && !authorized(req)) return respond_unauthorized(res);
    const std::string id = req.matches[1];
    if (id != config_.model_id) return respond_error(res, model_not_found(id, config_.model_id));
    respond_json(res, 200, model_object(config_.model_id, started_));
  });
  server_.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const bool accepting = scheduler_.snapshot().accepting;
    respond_json(res, accepting ? 200 : 503, {{"status", accepting ? "ok" : "draining"}});
  });
  server_.Get("/metrics", [this](const httplib::Request& req, httplib::Response& res) {
    if (needs_key(req) && !authorized(req)) return respond_unauthorized(res);
    res.status = 200;
    res.set_content(metrics_.render(scheduler_.snapshot()), "text/plain; version=0.0.4");
  });
  server_.Get("/", [](const httplib::Request&, httplib::Response& res) {
    const std::string_view page = chat_page_html();
    res.status = 200;
    // The page is self-contained: it loads nothing from elsewhere and talks only to this server.
    res.set_header("Content-Security-Policy",
                   "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                   "img-src data:");
    res.set_content(page.data(), page.size(), "text/html; charset=utf-8");
  });
  server_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    return before_routing(req, res);
  });
  server_.set_error_handler(httplib::Server::HandlerWithResponse(
      [this](const httplib::Request& req, httplib::Response& res) { return on_error(req, res); }));
  server_.set_exception_handler(
      [this](const httplib::Request&, httplib::Response& res, std::exception_ptr exception) {
        on_exception(res, exception);
      });
  server_.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    metrics_.count_request(route_label(req.path), res.status);
  });
}

// Waits for SIGTERM or SIGINT (or for the server to end by itself), then drains and stops it.
void FrontEnd::shutdown_on_signal(int signal_pipe_read) {
  char byte = 0;
  for (;;) {
    const ssize_t got = ::read(signal_pipe_read, &byte, 1);
    if (got == 1) break;
    if (got < 0 && errno == EINTR) continue;
    return;
  }
  if (byte != 's') return;  // the server ended without a signal
  std::fprintf(stderr, "shutting down: refusing new requests, finishing those in flight\n");
  std::fflush(stderr);
  scheduler_.stop_accepting();
  scheduler_.wait_idle();
  // The scheduler is done; the last events may still be on their way to clients.
  const Clock::time_point drain_start = Clock::now();
  while (responses_in_flight_.load() > 0 && Clock::now() - drain_start < kResponseDrainLimit) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // stop() only takes effect once listening has begun.
  while (!server_.is_running() && !listening_done_.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  server_.stop();
}

void FrontEnd::run() {
  install_routes();
  server_.set_payload_max_length(static_cast<size_t>(config_.max_body_bytes));
  const size_t threads = static_cast<size_t>(std::max(config_.http_threads, 1));
  server_.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  server_.set_keep_alive_timeout(5);

  int port = config_.port;
  if (port == 0) {
    port = server_.bind_to_any_port(config_.host);
  } else if (!server_.bind_to_port(config_.host, port)) {
    port = -1;
  }
  if (port < 0) {
    throw Error("cannot listen on " + config_.host + ":" + std::to_string(config_.port) +
                " (the port is in use or the host is not an address of this machine)");
  }

  int signal_pipe[2];
  if (::pipe(signal_pipe) != 0) throw Error("cannot create the shutdown pipe");
  ::fcntl(signal_pipe[1], F_SETFL, O_NONBLOCK);
  g_signal_pipe_write = signal_pipe[1];
  struct sigaction action {};
  action.sa_handler = on_shutdown_signal;
  sigemptyset(&action.sa_mask);
  struct sigaction previous_term {};
  struct sigaction previous_int {};
  ::sigaction(SIGTERM, &action, &previous_term);
  ::sigaction(SIGINT, &action, &previous_int);
  // A client that disconnects mid-write must not kill the server.
  ::signal(SIGPIPE, SIG_IGN);

  std::thread shutdown_thread([this, read_end = signal_pipe[0]] { shutdown_on_signal(read_end); });
  std::fprintf(stderr, "listening on http://%s:%d\n", config_.host.c_str(), port);
  std::fflush(stderr);
  const bool clean = server_.listen_after_bind();
  listening_done_ = true;
  const char quit = 'q';
  [[maybe_unused]] const ssize_t written = ::write(signal_pipe[1], &quit, 1);
  shutdown_thread.join();

  ::sigaction(SIGTERM, &previous_term, nullptr);
  ::sigaction(SIGINT, &previous_int, nullptr);
  g_signal_pipe_write = -1;
  ::close(signal_pipe[0]);
  ::close(signal_pipe[1]);
  if (!clean) throw Error("the HTTP server stopped accepting connections unexpectedly");
}

}  // namespace

void run_http_server(Scheduler& scheduler, const Tokenizer& tokenizer, const ServeConfig& config) {
  FrontEnd front_end(scheduler, tokenizer, config);
  front_end.run();
}

}  // namespace entropyinfer::serve
