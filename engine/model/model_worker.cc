#include "engine/model/model_worker.h"

#include "engine/sampling/sampler.h"

namespace tandem::model {

ModelWorker::ModelWorker(std::unique_ptr<kernels::Backend> backend,
                         std::unique_ptr<LlamaModel> model)
    : backend_(std::move(backend)), model_(std::move(model)) {}

step::StepResult ModelWorker::Execute(const step::StepPlan& plan) {
  step::StepResult result;
  if (!plan.block_copies.empty()) {
    std::vector<std::pair<int32_t, int32_t>> copies;
    for (const step::BlockCopy& c : plan.block_copies) copies.emplace_back(c.from, c.to);
    result.status = model_->CopyBlocks(copies);
    if (!result.status.ok()) return result;
  }
  std::vector<SequenceInput> inputs;
  inputs.reserve(plan.sequences.size());
  for (const step::SequenceStep& s : plan.sequences) {
    SequenceInput in;
    in.tokens = s.tokens;
    in.first_position = s.first_position;
    in.block_table = s.block_table;
    in.logits = s.sample ? 1 : 0;
    inputs.push_back(in);
  }
  result.status = model_->Forward(inputs, &logits_);
  if (!result.status.ok()) return result;

  const size_t vocab = static_cast<size_t>(model_->config().vocab);
  size_t row = 0;
  result.sequences.reserve(plan.sequences.size());
  for (const step::SequenceStep& s : plan.sequences) {
    step::SequenceResult r;
    r.sequence_id = s.sequence_id;
    if (s.sample) {
      std::span<const float> logits(logits_.data() + row * vocab, vocab);
      r.sampled = sampling::Sample(logits, s.sampling, s.draw_index);
      if (s.logprobs > 0) r.logprobs = sampling::Logprobs(logits, *r.sampled, s.logprobs);
      ++row;
    }
    result.sequences.push_back(r);
  }
  return result;
}

}  // namespace tandem::model
