#include "server/generation_frontend.h"

#include "absl/time/clock.h"
#include "common/random_id.h"
#include "engine/tokenizer/incremental_detokenizer.h"
#include "server/logging.h"
#include "spdlog/spdlog.h"

namespace tandem::server {

GenerationFrontend::GenerationFrontend(ServingModel* model, scheduler::Scheduler* scheduler,
                                       ServerMetrics* metrics, FrontendOptions options)
    : model_(model),
      scheduler_(scheduler),
      metrics_(metrics),
      options_(std::move(options)),
      tool_format_(ToolCallFormatOf(model->chat_template().source())),
      template_reasons_(model->chat_template().source().find("<think>") != std::string::npos) {
  if (options_.slow_reader_timeout > absl::ZeroDuration()) {
    watchdog_ = std::make_unique<SlowReaderWatchdog>(
        options_.slow_reader_timeout, [metrics] { metrics->OnSlowReaderCancelled(); });
  }
}

absl::Status GenerationFrontend::Start(const v1::GenerateRequest& request,
                                       std::optional<absl::Time> client_deadline,
                                       std::shared_ptr<ResponseChannel> channel,
                                       CancellationLink& link, std::string* id_out) {
  const absl::Time received = absl::Now();  // the request's timeline starts here
  const std::string request_id =
      request.request_id().empty() ? RandomHexId("req-", 16) : request.request_id();
  auto reject = [&](absl::Status status) {
    spdlog::info("request {} rejected: {}", request_id, status.ToString());
    metrics_->OnRejected();
    return status;
  };
  if (!options_.accepts_prompts) {
    return reject(absl::FailedPreconditionError(
        "this daemon runs with --role=decode: it decodes requests that prefill daemons hand "
        "over; send prompts to a prefill or unified daemon"));
  }
  if (!accepting()) {
    return reject(absl::UnavailableError("the server is draining; retry on another instance"));
  }
  ModelLimits limits{&model_->tokenizer(),       &model_->chat_template(), model_->context_length(),
                     options_.max_prompt_tokens, &model_->grammar(),       tool_format_};
  absl::StatusOr<BuiltRequest> built =
      BuildRequest(request, limits, options_.defaults, RandomU64());
  if (!built.ok()) return reject(built.status());
  scheduler::Request& r = built->request;
  r.id = request_id;
  r.received = received;
  r.deadline = absl::InfiniteFuture();
  if (client_deadline.has_value()) {
    r.deadline = *client_deadline;
  } else if (options_.default_deadline > absl::ZeroDuration()) {
    r.deadline = received + options_.default_deadline;
  }
  const int32_t prompt_tokens = static_cast<int32_t>(r.prompt.size());
  ServerMetrics* metrics = metrics_;
  // Tool calls are parsed out for requests that let the model call tools;
  // reasoning for every chat answer of a template that renders it.
  std::unique_ptr<ToolCallParser> parser;
  const bool tools = built->parse_tool_calls && tool_format_ != ToolCallFormat::kNone;
  const bool reasoning = template_reasons_ && !request.messages().empty();
  if (tools || reasoning) {
    parser = std::make_unique<ToolCallParser>(tools ? tool_format_ : ToolCallFormat::kNone,
                                              reasoning, built->starts_in_reasoning);
  }
  r.sink = std::make_shared<ResponseStream>(
      request_id, model_->tokenizer(), std::move(built->stop_strings), std::move(channel),
      [metrics, prompt_tokens](const std::string& id, const scheduler::FinishInfo& info,
                               const std::vector<double>& token_gaps) {
        metrics->OnFinish(info, token_gaps);
        spdlog::info("{}", RequestFinishedLine(id, prompt_tokens, info));
      },
      std::move(parser));
  absl::StatusOr<uint64_t> id = scheduler_->Submit(std::move(r));
  if (!id.ok()) return reject(id.status());
  link.Started(*id);
  if (id_out != nullptr) *id_out = request_id;
  return absl::OkStatus();
}

absl::StatusOr<v1::TokenizeResponse> GenerationFrontend::Tokenize(
    const v1::TokenizeRequest& request) const {
  const tokenizer::BpeTokenizer& tok = model_->tokenizer();
  const bool has_text = !request.text().empty(), has_messages = !request.messages().empty();
  if (has_text == has_messages) {
    return absl::InvalidArgumentError("text: set exactly one of text and messages");
  }
  std::vector<tokenizer::TokenId> ids;
  if (has_text) {
    ids = tok.Encode(request.text(), /*parse_special=*/true);
    if (tok.add_bos()) ids.insert(ids.begin(), *tok.special().bos);
  } else {
    absl::StatusOr<std::vector<tokenizer::TokenId>> encoded =
        EncodeConversation(request.messages(), {}, model_->chat_template(), tok);
    if (!encoded.ok()) return encoded.status();
    ids = *std::move(encoded);
  }
  v1::TokenizeResponse response;
  for (tokenizer::TokenId id : ids) {
    response.add_token_ids(static_cast<uint32_t>(id));
    response.add_tokens(tokenizer::SanitizeUtf8(tok.TokenBytes(id)));
  }
  return response;
}

v1::ModelInfo GenerationFrontend::ModelInfo() const {
  v1::ModelInfo info = options_.model_info;
  // What the scheduler has learned so far: the step-time model, and where
  // the SLO policy would now split a lone request.
  const scheduler::Scheduler::PolicyReport report = scheduler_->ReportPolicy();
  info.set_step_time_model(report.step_time);
  info.set_slo_crossover_tokens(
      options_.slo_paths && report.crossover_tokens ? *report.crossover_tokens : -1);
  return info;
}

v1::Load GenerationFrontend::Load() const {
  const scheduler::SchedulerLoad load = scheduler_->Load();
  v1::Load out;
  out.set_waiting(load.waiting);
  out.set_running_prefill(load.running[0]);
  out.set_running_decode(load.running[1]);
  out.set_kv_used_blocks(load.kv.used_blocks);
  out.set_kv_total_blocks(load.kv.total_blocks);
  out.set_kv_usage(load.kv.total_blocks > 0
                       ? static_cast<double>(load.kv.used_blocks) / load.kv.total_blocks
                       : 0.0);
  out.set_accepting(accepting());
  out.set_open_calls(open_calls());
  if (load.least_slack_ms.has_value()) out.set_slo_slack_ms(*load.least_slack_ms);
  out.set_running_remote(load.running_remote);
  out.set_accepts_prompts(options_.accepts_prompts);
  out.set_arithmetic(options_.arithmetic);
  return out;
}

}  // namespace tandem::server
