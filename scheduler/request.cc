#include "scheduler/request.h"

namespace tandem::scheduler {

std::string_view PathName(Path path) {
  switch (path) {
    case Path::kColocated:
      return "colocated";
    case Path::kDisaggregated:
      return "disaggregated";
    case Path::kRemote:
      return "remote";
  }
  return "unknown";
}

std::string_view StageName(Stage stage) {
  switch (stage) {
    case Stage::kQueued:
      return "queued";
    case Stage::kPrefill:
      return "prefill";
    case Stage::kHandoff:
      return "handoff";
    case Stage::kDecode:
      return "decode";
  }
  return "unknown";
}

std::string_view PathReasonName(PathReason reason) {
  switch (reason) {
    case PathReason::kDisaggregationOff:
      return "disaggregation_off";
    case PathReason::kBelowThreshold:
      return "below_threshold";
    case PathReason::kThresholdReached:
      return "threshold_reached";
    case PathReason::kExpectedOutputHint:
      return "expected_output_hint";
    case PathReason::kWorkloadEstimate:
      return "workload_estimate";
    case PathReason::kMaxTokens:
      return "max_tokens";
    case PathReason::kSloHeadroom:
      return "slo_headroom";
  }
  return "unknown";
}

std::string_view ProposerName(step::Proposer proposer) {
  switch (proposer) {
    case step::Proposer::kNone:
      return "none";
    case step::Proposer::kNgram:
      return "ngram";
    case step::Proposer::kDraftModel:
      return "draft";
    case step::Proposer::kSuffix:
      return "suffix";
  }
  return "unknown";
}

std::string_view DraftSourceName(step::DraftSource source) {
  switch (source) {
    case step::DraftSource::kRequest:
      return "request";
    case step::DraftSource::kGlobal:
      return "global";
    case step::DraftSource::kModel:
      return "model";
  }
  return "unknown";
}

}  // namespace tandem::scheduler
