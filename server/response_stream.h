// Turns one request's scheduler events into GenerateResponse messages:
// incremental detokenization, stop strings, the final message with
// finish_reason, usage and timeline. Knows nothing of gRPC: it hands messages
// to a ResponseChannel (the gRPC stream in production, a recorder in tests).
#ifndef TANDEM_SERVER_RESPONSE_STREAM_H_
#define TANDEM_SERVER_RESPONSE_STREAM_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/tokenizer/incremental_detokenizer.h"
#include "scheduler/request.h"
#include "server/stop_strings.h"
#include "server/tool_call_parser.h"
#include "tandem/v1/generate.pb.h"

namespace tandem::server {

// Where a request's messages go. Thread-safe; never blocks.
class ResponseChannel {
 public:
  virtual ~ResponseChannel() = default;
  virtual void Send(v1::GenerateResponse response) = 0;
  // Ends the stream with `status`, after every message sent before.
  virtual void Close(absl::Status status) = 0;
};

// Called once per finished request (for the log line and metrics), with the
// gaps between consecutive generated tokens in seconds.
using FinishObserver =
    std::function<void(const std::string& request_id, const scheduler::FinishInfo& info,
                       const std::vector<double>& token_gaps)>;

class ResponseStream final : public scheduler::RequestSink {
 public:
  // `parser`, when set, splits tool calls and reasoning out of the text
  // (after stop strings: they match the answer as the model wrote it).
  ResponseStream(std::string request_id, const tokenizer::BpeTokenizer& tokenizer,
                 std::vector<std::string> stop_strings, std::shared_ptr<ResponseChannel> channel,
                 FinishObserver observer, std::unique_ptr<ToolCallParser> parser = nullptr);

  bool OnToken(scheduler::TokenId token, bool is_stop_token,
               const step::TokenLogprobs* logprobs) override;
  void OnFinish(const scheduler::FinishInfo& info) override;

 private:
  // Puts `text` (or a control token) through the parser into `response`.
  void Split(std::string_view text, std::optional<scheduler::TokenId> control, bool final,
             v1::GenerateResponse& response);

  std::string request_id_;
  const tokenizer::BpeTokenizer& tokenizer_;
  tokenizer::IncrementalDetokenizer detokenizer_;
  StopStringMatcher stops_;
  std::shared_ptr<ResponseChannel> channel_;
  FinishObserver observer_;
  std::unique_ptr<ToolCallParser> parser_;
  absl::Time last_token_ = absl::InfinitePast();
  std::vector<double> token_gaps_;
};

// Folds `next` into `acc`: text, tokens and logprobs append; the final
// message's fields (finish_reason, usage, timeline, path) override.
void MergeResponse(v1::GenerateResponse& acc, v1::GenerateResponse&& next);

// The timeline message of a finished request, in milliseconds.
v1::Timeline TimelineToProto(const scheduler::Timeline& timeline);
v1::Path PathToProto(scheduler::Path path);
v1::PathReason PathReasonToProto(scheduler::PathReason reason);
// The inverse, for a reason that crossed to another daemon (unknown values:
// kThresholdReached).
scheduler::PathReason PathReasonFromProto(v1::PathReason reason);
// A token's log-probabilities as the API carries them, and back (between
// daemons).
void LogprobsToProto(const step::TokenLogprobs& in, v1::TokenLogprobs* out);
step::TokenLogprobs LogprobsFromProto(const v1::TokenLogprobs& in);

}  // namespace tandem::server

#endif  // TANDEM_SERVER_RESPONSE_STREAM_H_
