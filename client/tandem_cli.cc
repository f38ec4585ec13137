// tandem: a command-line client for tandemd.
//
//   tandem chat "What is the capital of France?"   one user turn, chat template
//   tandem generate "Once upon a time"             raw prompt, no template
//   tandem generate --prompt_file=FILE             the prompt from a file
//   tandem chat-template --model=GGUF < conversation.json
//                                                  the prompt the chat template renders
//   tandem tokenize --model=GGUF "TEXT"            token ids, without a daemon
//   tandem tokenize --model=GGUF --ids "1 2 3"     and back to text
//   tandem shape [--metrics=URL]                   the traffic's token shape, and
//                                                  whether disaggregation pays
//   tandem bench --scenario=chat [...]             load in a product's token shape:
//                                                  latency, throughput, goodput
//                                                  (client/bench/, docs/benchmarking.md)
//
// The answer streams to stdout as it is generated; a summary (finish reason,
// tokens, timings) goes to stderr.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/bench/bench_command.h"
#include "client/chat_template_command.h"
#include "client/shape.h"
#include "client/tokenize_command.h"
#include "tandem/v1/generate.grpc.pb.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051",
          "tandemd address (bench: several, comma-separated, take requests in turn)");
ABSL_FLAG(int, max_tokens, 0, "most tokens to generate (0: the server's default)");
ABSL_FLAG(double, temperature, -1.0, "sampling temperature (0: greedy; < 0: server default)");
ABSL_FLAG(int, top_k, -1, "top-k (0: off; < 0: server default)");
ABSL_FLAG(double, top_p, -1.0, "top-p in (0, 1] (< 0: server default)");
ABSL_FLAG(int64_t, seed, -1, "sampling seed (< 0: random)");
ABSL_FLAG(std::string, system, "", "system message (chat)");
ABSL_FLAG(std::string, template_file, "",
          "chat-template: render with this .jinja file instead of the model's template");
ABSL_DECLARE_FLAG(std::string, model);
ABSL_FLAG(bool, ids, false, "tokenize: the argument is token ids to turn back into text");
ABSL_FLAG(std::vector<std::string>, stop, {}, "stop strings, comma-separated");
ABSL_FLAG(double, timeout, 300.0, "seconds before the request is abandoned");
ABSL_FLAG(std::string, prompt_file, "", "read the question or prompt from this file");
ABSL_FLAG(std::string, cache_salt, "", "prefix-cache salt (requests share cache only within one)");
ABSL_FLAG(bool, disable_speculation, false, "no speculative decoding for this request");
ABSL_FLAG(std::string, metrics, "http://127.0.0.1:9400/metrics",
          "metrics URL (shape; bench: one per --server, comma-separated, \"\" for none)");

namespace {

const char* ReasonName(tandem::v1::FinishReason r) {
  switch (r) {
    case tandem::v1::FINISH_REASON_STOP:
      return "stop";
    case tandem::v1::FINISH_REASON_LENGTH:
      return "length";
    case tandem::v1::FINISH_REASON_CANCELLED:
      return "cancelled";
    case tandem::v1::FINISH_REASON_ERROR:
      return "error";
    default:
      return "unspecified";
  }
}

int Run(const std::string& command, const std::string& text) {
  tandem::v1::GenerateRequest request;
  if (command == "chat") {
    if (!absl::GetFlag(FLAGS_system).empty()) {
      auto* m = request.add_messages();
      m->set_role("system");
      m->set_content(absl::GetFlag(FLAGS_system));
    }
    auto* m = request.add_messages();
    m->set_role("user");
    m->set_content(text);
  } else if (command == "generate") {
    request.set_prompt(text);
  } else {
    std::cerr << "unknown command '" << command << "' (chat or generate)\n";
    return 2;
  }
  if (absl::GetFlag(FLAGS_max_tokens) > 0) request.set_max_tokens(absl::GetFlag(FLAGS_max_tokens));
  auto* sampling = request.mutable_sampling();
  if (absl::GetFlag(FLAGS_temperature) >= 0) {
    sampling->set_temperature(static_cast<float>(absl::GetFlag(FLAGS_temperature)));
  }
  if (absl::GetFlag(FLAGS_top_k) >= 0) sampling->set_top_k(absl::GetFlag(FLAGS_top_k));
  if (absl::GetFlag(FLAGS_top_p) >= 0) {
    sampling->set_top_p(static_cast<float>(absl::GetFlag(FLAGS_top_p)));
  }
  if (absl::GetFlag(FLAGS_seed) >= 0) {
    sampling->set_seed(static_cast<uint64_t>(absl::GetFlag(FLAGS_seed)));
  }
  for (const std::string& s : absl::GetFlag(FLAGS_stop)) request.add_stop(s);
  request.set_cache_salt(absl::GetFlag(FLAGS_cache_salt));
  request.set_disable_speculation(absl::GetFlag(FLAGS_disable_speculation));

  auto channel =
      grpc::CreateChannel(absl::GetFlag(FLAGS_server), grpc::InsecureChannelCredentials());
  auto stub = tandem::v1::Generation::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(
      std::chrono::system_clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(absl::GetFlag(FLAGS_timeout) * 1000)));
  std::unique_ptr<grpc::ClientReader<tandem::v1::GenerateResponse>> reader =
      stub->Generate(&context, request);
  tandem::v1::GenerateResponse response;
  tandem::v1::GenerateResponse last;
  while (reader->Read(&response)) {
    std::cout << response.text() << std::flush;
    if (response.finish_reason() != tandem::v1::FINISH_REASON_UNSPECIFIED) last = response;
  }
  std::cout << "\n";
  const grpc::Status status = reader->Finish();
  if (!status.ok()) {
    std::cerr << "error: " << status.error_code() << " " << status.error_message() << "\n";
    return 1;
  }
  std::cerr << "[" << last.request_id() << "] finish_reason=" << ReasonName(last.finish_reason())
            << " prompt_tokens=" << last.usage().prompt_tokens()
            << " completion_tokens=" << last.usage().completion_tokens()
            << " cached_prompt_tokens=" << last.usage().cached_prompt_tokens()
            << " drafted_tokens=" << last.usage().drafted_tokens()
            << " accepted_tokens=" << last.usage().accepted_tokens()
            << " first_token_ms=" << last.timeline().first_token_ms()
            << " total_ms=" << last.timeline().total_ms() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "a command-line client for tandemd.\n\n"
      "  tandem chat \"QUESTION\"        one user turn through the model's chat template\n"
      "  tandem generate \"PROMPT\"      a raw prompt, no template (or --prompt_file=FILE)\n"
      "  tandem chat-template          the prompt a conversation (JSON on stdin, OpenAI shapes)\n"
      "                                becomes under --model's chat template (or --template_file)\n"
      "  tandem tokenize \"TEXT\"        TEXT's token ids under --model's tokenizer (a model or\n"
      "                                a vocabulary-only GGUF; stdin without TEXT); --ids: the\n"
      "                                text of token ids\n"
      "  tandem shape                  the traffic's token shape from --metrics, and whether\n"
      "                                disaggregation pays\n"
      "  tandem bench                  load in a product's token shape (--scenario): TTFT,\n"
      "                                inter-token latency, throughput, goodput; a peer side by\n"
      "                                side (--peer=llama-server or --peer=openai); "
      "--sweep_threshold\n\n"
      "The answer streams to stdout; a summary goes to stderr. Flags:");
  // --help lists this client's flags (Abseil's default matches only a file
  // named after the binary).
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::string_view(file).find("client/") != absl::string_view::npos;
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  absl::SetFlagsUsageConfig(usage);
  // Flags may be spelled with dashes (--sweep-threshold) or underscores.
  std::vector<std::string> normalized(argv, argv + argc);
  for (std::string& arg : normalized) {
    if (arg.rfind("--", 0) != 0) continue;
    const size_t end = std::min(arg.find('='), arg.size());
    std::replace(arg.begin() + 2, arg.begin() + static_cast<std::ptrdiff_t>(end), '-', '_');
  }
  std::vector<char*> normalized_argv;
  for (std::string& arg : normalized) normalized_argv.push_back(arg.data());
  std::vector<char*> args =
      absl::ParseCommandLine(static_cast<int>(normalized_argv.size()), normalized_argv.data());
  if (args.size() == 2 && std::string(args[1]) == "bench") {
    return tandem::bench::RunBenchCommand(absl::GetFlag(FLAGS_server), absl::GetFlag(FLAGS_metrics),
                                          absl::StrJoin(argv, argv + argc, " "));
  }
  if (args.size() == 2 && std::string(args[1]) == "chat-template") {
    return tandem::client::RunChatTemplateCommand(absl::GetFlag(FLAGS_model),
                                                  absl::GetFlag(FLAGS_template_file), std::cin,
                                                  std::cout, std::cerr);
  }
  if ((args.size() == 2 || args.size() == 3) && std::string(args[1]) == "tokenize") {
    tandem::client::TokenizeOptions options;
    options.model_path = absl::GetFlag(FLAGS_model);
    options.decode = absl::GetFlag(FLAGS_ids);
    if (args.size() == 3) {
      options.input = args[2];
    } else {
      options.input.assign(std::istreambuf_iterator<char>(std::cin),
                           std::istreambuf_iterator<char>());
    }
    return tandem::client::RunTokenizeCommand(options, std::cout, std::cerr);
  }
  if (args.size() == 2 && std::string(args[1]) == "shape") {
    absl::StatusOr<std::string> text = tandem::client::HttpGet(absl::GetFlag(FLAGS_metrics));
    if (!text.ok()) {
      std::cerr << "error: " << text.status() << "\n";
      return 1;
    }
    std::cout << tandem::client::ShapeReport(
        tandem::client::ParseMetrics(*text),
        absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
    return 0;
  }
  if (const std::string file = absl::GetFlag(FLAGS_prompt_file);
      !file.empty() && args.size() == 2) {
    std::ifstream in(file);
    if (!in) {
      std::cerr << "cannot read --prompt_file=" << file << "\n";
      return 2;
    }
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return Run(args[1], text);
  }
  if (args.size() != 3) {
    std::cerr << "usage: tandem chat \"QUESTION\" | tandem generate \"PROMPT\" [flags]\n"
              << "run 'tandem --help' for the flags\n";
    return 2;
  }
  return Run(args[1], args[2]);
}
