#include "client/bench/workload.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/bench/file_edits.h"
#include "google/protobuf/util/json_util.h"

namespace tandem::bench {

int DrawLength(const v1::Lengths& lengths, std::mt19937_64& rng) {
  double value = lengths.median();
  if (lengths.sigma() > 0) {
    std::lognormal_distribution<double> dist(std::log(static_cast<double>(lengths.median())),
                                             lengths.sigma());
    value = dist(rng);
  }
  int n = static_cast<int>(std::lround(value));
  if (lengths.min() > 0) n = std::max(n, lengths.min());
  if (lengths.max() > 0) n = std::min(n, lengths.max());
  return std::max(n, 1);
}

std::vector<double> PoissonArrivals(double rate, int count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(rate);
  std::vector<double> times;
  times.reserve(static_cast<size_t>(std::max(count, 0)));
  double t = 0;
  for (int i = 0; i < count; ++i) {
    t += gap(rng);
    times.push_back(t);
  }
  return times;
}

TokenIds Corpus::Window(uint64_t offset, int length) const {
  TokenIds out;
  out.reserve(static_cast<size_t>(length));
  for (int i = 0; i < length; ++i) out.push_back(tokens_[(offset + i) % tokens_.size()]);
  return out;
}

namespace {
// A well-mixed 64-bit hash (splitmix64's finaliser): offsets of different
// requests land far apart.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
}  // namespace

PromptBuilder::PromptBuilder(const Corpus& corpus, const v1::RequestClass& request_class,
                             uint64_t seed)
    : corpus_(corpus),
      shared_ratio_(request_class.shared_prefix_ratio()),
      groups_(std::max(request_class.prefix_groups(), 1)),
      seed_(Mix(seed ^ std::hash<std::string>()(request_class.name()))) {}

TokenIds PromptBuilder::Prompt(int64_t index, int length) const {
  const int shared = static_cast<int>(std::lround(shared_ratio_ * length));
  const uint64_t group = static_cast<uint64_t>(index) % static_cast<uint64_t>(groups_);
  TokenIds prompt = corpus_.Window(Mix(seed_ + 2 * group + 1), shared);
  const TokenIds own =
      corpus_.Window(Mix(seed_ ^ Mix(static_cast<uint64_t>(index) + 7777)), length - shared);
  prompt.insert(prompt.end(), own.begin(), own.end());
  return prompt;
}

TokenIds PromptBuilder::TurnInput(int64_t index, int turn, int length) const {
  return corpus_.Window(Mix(seed_ ^ Mix(static_cast<uint64_t>(index) * 131 + turn + 99991)),
                        length);
}

std::string ExecutableDir() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "." : self.parent_path().string();
}

absl::StatusOr<std::string> CorpusText(const std::string& source_dir, const std::string& name) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  std::error_code ec;
  auto add_tree = [&](const fs::path& dir, std::vector<std::string> extensions) {
    for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      if (!it->is_regular_file()) continue;
      const std::string ext = it->path().extension().string();
      if (std::find(extensions.begin(), extensions.end(), ext) != extensions.end()) {
        files.push_back(it->path());
      }
    }
  };
  const fs::path root(source_dir);
  if (name == "code") {
    for (const std::string& path : CodeFilePaths(source_dir)) files.push_back(path);
  } else {
    add_tree(root / "docs", {".md"});
    files.push_back(root / "README.md");
  }
  std::sort(files.begin(), files.end());
  std::string text;
  for (const fs::path& file : files) {
    std::ifstream in(file);
    if (!in) continue;
    std::stringstream content;
    content << in.rdbuf();
    text += content.str();
    text += "\n\n";
  }
  if (text.size() < 4096) {
    return absl::NotFoundError(absl::StrCat("the '", name, "' corpus under ", source_dir,
                                            " is missing or too small (use --source_dir)"));
  }
  return text;
}

absl::StatusOr<std::vector<v1::TraceRecord>> ParseTrace(const std::string& jsonl) {
  std::vector<v1::TraceRecord> records;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(jsonl, '\n')) {
    ++line_number;
    if (line.find_first_not_of(" \t\r") == absl::string_view::npos) continue;
    v1::TraceRecord record;
    google::protobuf::util::JsonParseOptions options;
    options.ignore_unknown_fields = false;
    if (auto s = google::protobuf::util::JsonStringToMessage(std::string(line), &record, options);
        !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("trace line ", line_number, ": ", s.ToString()));
    }
    if (record.output_tokens() <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("trace line ", line_number, ": output_tokens must be positive"));
    }
    if (record.prompt().empty() == (record.input_tokens() <= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("trace line ", line_number, ": set exactly one of prompt and input_tokens"));
    }
    if (record.arrival_s() < 0 ||
        (!records.empty() && record.arrival_s() < records.back().arrival_s())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "trace line ", line_number, ": arrival_s must be >= 0 and must not decrease"));
    }
    records.push_back(std::move(record));
  }
  if (records.empty()) return absl::InvalidArgumentError("the trace has no records");
  return records;
}

}  // namespace tandem::bench
