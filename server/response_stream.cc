#include "server/response_stream.h"

#include "absl/time/clock.h"
#include "common/random_id.h"

namespace tandem::server {
namespace {

double Ms(absl::Time from, absl::Time to) {
  if (from == absl::InfinitePast() || to == absl::InfinitePast()) return 0.0;
  return absl::ToDoubleMilliseconds(to - from);
}

v1::FinishReason ToProto(scheduler::FinishReason reason) {
  switch (reason) {
    case scheduler::FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case scheduler::FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case scheduler::FinishReason::kCancelled:
      return v1::FINISH_REASON_CANCELLED;
    case scheduler::FinishReason::kError:
      return v1::FINISH_REASON_ERROR;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

}  // namespace

v1::Timeline TimelineToProto(const scheduler::Timeline& t) {
  v1::Timeline out;
  const absl::Time first_token = t.first_token == absl::InfinitePast() ? t.finished : t.first_token;
  const absl::Time scheduled = t.scheduled == absl::InfinitePast() ? t.finished : t.scheduled;
  // A handoff that never reached the decode worker (cancelled in between)
  // lasted until the end.
  const absl::Time handoff_end = t.handoff_end == absl::InfinitePast() ? t.finished : t.handoff_end;
  const double handoff =
      t.handoff_start == absl::InfinitePast() ? 0.0 : Ms(t.handoff_start, handoff_end);
  out.set_queued_ms(Ms(t.arrival, scheduled));
  out.set_prefill_ms(Ms(scheduled, first_token));
  out.set_first_token_ms(Ms(t.arrival, first_token));
  out.set_handoff_ms(handoff);
  out.set_decode_ms(Ms(first_token, t.finished) - handoff);
  out.set_total_ms(Ms(t.arrival, t.finished));
  if (t.kv_transfer_start != absl::InfinitePast()) {
    out.set_kv_transfer_ms(Ms(t.kv_transfer_start, t.kv_transfer_end == absl::InfinitePast()
                                                       ? t.finished
                                                       : t.kv_transfer_end));
  }
  return out;
}

v1::Path PathToProto(scheduler::Path path) {
  switch (path) {
    case scheduler::Path::kColocated:
      return v1::PATH_COLOCATED;
    case scheduler::Path::kDisaggregated:
      return v1::PATH_DISAGGREGATED;
    case scheduler::Path::kRemote:
      return v1::PATH_REMOTE;
  }
  return v1::PATH_UNSPECIFIED;
}

void LogprobsToProto(const step::TokenLogprobs& in, v1::TokenLogprobs* out) {
  out->set_token_id(static_cast<uint32_t>(in.token));
  out->set_logprob(in.logprob);
  for (const auto& [id, value] : in.top) {
    v1::TopLogprob* top = out->add_top();
    top->set_token_id(static_cast<uint32_t>(id));
    top->set_logprob(value);
  }
}

step::TokenLogprobs LogprobsFromProto(const v1::TokenLogprobs& in) {
  step::TokenLogprobs out;
  out.token = static_cast<scheduler::TokenId>(in.token_id());
  out.logprob = in.logprob();
  for (const v1::TopLogprob& top : in.top()) {
    out.top.emplace_back(static_cast<scheduler::TokenId>(top.token_id()), top.logprob());
  }
  return out;
}

scheduler::PathReason PathReasonFromProto(v1::PathReason reason) {
  switch (reason) {
    case v1::PATH_REASON_DISAGGREGATION_OFF:
      return scheduler::PathReason::kDisaggregationOff;
    case v1::PATH_REASON_BELOW_THRESHOLD:
      return scheduler::PathReason::kBelowThreshold;
    case v1::PATH_REASON_EXPECTED_OUTPUT_HINT:
      return scheduler::PathReason::kExpectedOutputHint;
    case v1::PATH_REASON_WORKLOAD_ESTIMATE:
      return scheduler::PathReason::kWorkloadEstimate;
    case v1::PATH_REASON_MAX_TOKENS:
      return scheduler::PathReason::kMaxTokens;
    case v1::PATH_REASON_SLO_HEADROOM:
      return scheduler::PathReason::kSloHeadroom;
    default:
      return scheduler::PathReason::kThresholdReached;
  }
}

v1::PathReason PathReasonToProto(scheduler::PathReason reason) {
  switch (reason) {
    case scheduler::PathReason::kDisaggregationOff:
      return v1::PATH_REASON_DISAGGREGATION_OFF;
    case scheduler::PathReason::kBelowThreshold:
      return v1::PATH_REASON_BELOW_THRESHOLD;
    case scheduler::PathReason::kThresholdReached:
      return v1::PATH_REASON_THRESHOLD_REACHED;
    case scheduler::PathReason::kExpectedOutputHint:
      return v1::PATH_REASON_EXPECTED_OUTPUT_HINT;
    case scheduler::PathReason::kWorkloadEstimate:
      return v1::PATH_REASON_WORKLOAD_ESTIMATE;
    case scheduler::PathReason::kMaxTokens:
      return v1::PATH_REASON_MAX_TOKENS;
    case scheduler::PathReason::kSloHeadroom:
      return v1::PATH_REASON_SLO_HEADROOM;
  }
  return v1::PATH_REASON_UNSPECIFIED;
}

ResponseStream::ResponseStream(std::string request_id, const tokenizer::BpeTokenizer& tokenizer,
                               std::vector<std::string> stop_strings,
                               std::shared_ptr<ResponseChannel> channel, FinishObserver observer,
                               std::unique_ptr<ToolCallParser> parser)
    : request_id_(std::move(request_id)),
      tokenizer_(tokenizer),
      detokenizer_(tokenizer),
      stops_(std::move(stop_strings)),
      channel_(std::move(channel)),
      observer_(std::move(observer)),
      parser_(std::move(parser)) {}

void ResponseStream::Split(std::string_view text, std::optional<scheduler::TokenId> control,
                           bool final, v1::GenerateResponse& response) {
  if (parser_ == nullptr) {
    response.mutable_text()->append(text);
    return;
  }
  ParsedOutput out = control.has_value() ? parser_->PushControl(tokenizer_.TokenBytes(*control))
                                         : parser_->Push(text);
  if (final) {
    ParsedOutput rest = parser_->Finish();
    out.content += rest.content;
    out.reasoning += rest.reasoning;
    for (ParsedToolCall& call : rest.tool_calls) out.tool_calls.push_back(std::move(call));
  }
  response.mutable_text()->append(out.content);
  response.mutable_reasoning()->append(out.reasoning);
  for (ParsedToolCall& call : out.tool_calls) {
    v1::ToolCall* proto = response.add_tool_calls();
    proto->set_id(RandomHexId("call_", 24));  // as OpenAI's ids look
    proto->set_name(std::move(call.name));
    proto->set_arguments(std::move(call.arguments));
  }
}

bool ResponseStream::OnToken(scheduler::TokenId token, bool is_stop_token,
                             const step::TokenLogprobs* logprobs) {
  const absl::Time now = absl::Now();
  if (last_token_ != absl::InfinitePast()) {
    token_gaps_.push_back(absl::ToDoubleSeconds(now - last_token_));
  }
  last_token_ = now;
  v1::GenerateResponse response;
  response.set_request_id(request_id_);
  response.add_token_ids(static_cast<uint32_t>(token));
  if (logprobs != nullptr) LogprobsToProto(*logprobs, response.add_logprobs());
  if (!is_stop_token) {
    const bool control = parser_ != nullptr && token >= 0 && token < tokenizer_.vocab_size() &&
                         tokenizer_.Kind(token) == tokenizer::TokenKind::kControl;
    const std::string text = stops_.Push(detokenizer_.Push(token));
    Split(text, std::nullopt, false, response);
    // A control token the parser knows (<tool_call>, [TOOL_CALLS]) reaches it
    // as itself, after the text before it.
    if (control && !stops_.stopped()) Split("", token, false, response);
  }
  channel_->Send(std::move(response));
  return stops_.stopped();
}

void ResponseStream::OnFinish(const scheduler::FinishInfo& info) {
  v1::GenerateResponse last;
  last.set_request_id(request_id_);
  if (!stops_.stopped()) {
    // Whatever was held back (an unfinished character, a partial stop string)
    // belongs to the answer.
    std::string rest = stops_.Push(detokenizer_.Flush());
    Split(rest + stops_.Flush(), std::nullopt, /*final=*/true, last);
  } else if (parser_ != nullptr) {
    Split("", std::nullopt, /*final=*/true, last);
  }
  last.set_finish_reason(ToProto(info.reason));
  last.mutable_usage()->set_prompt_tokens(info.usage.prompt_tokens);
  last.mutable_usage()->set_completion_tokens(info.usage.completion_tokens);
  last.mutable_usage()->set_cached_prompt_tokens(info.usage.cached_prompt_tokens);
  last.mutable_usage()->set_drafted_tokens(info.usage.drafted_tokens);
  last.mutable_usage()->set_accepted_tokens(info.usage.accepted_tokens);
  *last.mutable_timeline() = TimelineToProto(info.timeline);
  last.set_path(PathToProto(info.path));
  last.set_path_reason(PathReasonToProto(info.path_reason));
  if (observer_) observer_(request_id_, info, token_gaps_);
  channel_->Send(std::move(last));
  switch (info.reason) {
    case scheduler::FinishReason::kStop:
    case scheduler::FinishReason::kLength:
      channel_->Close(absl::OkStatus());
      return;
    case scheduler::FinishReason::kCancelled:
      channel_->Close(info.error.ok() ? absl::CancelledError("cancelled") : info.error);
      return;
    case scheduler::FinishReason::kError:
      channel_->Close(absl::InternalError(info.error.message()));
      return;
  }
}

void MergeResponse(v1::GenerateResponse& acc, v1::GenerateResponse&& next) {
  if (acc.request_id().empty()) acc.set_request_id(next.request_id());
  acc.mutable_text()->append(next.text());
  acc.mutable_token_ids()->MergeFrom(next.token_ids());
  acc.mutable_logprobs()->MergeFrom(next.logprobs());
  acc.mutable_tool_calls()->MergeFrom(next.tool_calls());
  acc.mutable_reasoning()->append(next.reasoning());
  if (next.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
    acc.set_finish_reason(next.finish_reason());
    *acc.mutable_usage() = next.usage();
    *acc.mutable_timeline() = next.timeline();
    acc.set_path(next.path());
    acc.set_path_reason(next.path_reason());
  }
}

}  // namespace tandem::server
