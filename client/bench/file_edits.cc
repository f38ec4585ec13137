#include "client/bench/file_edits.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>

namespace tandem::bench {

std::vector<std::string> CodeFilePaths(const std::string& source_dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  std::error_code ec;
  for (const char* dir : {"engine", "scheduler", "server", "kvcache"}) {
    for (fs::recursive_directory_iterator it(fs::path(source_dir) / dir, ec), end; !ec && it != end;
         it.increment(ec)) {
      const std::string ext = it->path().extension().string();
      if (it->is_regular_file() && (ext == ".cc" || ext == ".h")) {
        files.push_back(it->path().string());
      }
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string EditInstruction(const std::string& code, int kind) {
  kind = (kind % 3 + 3) % 3;
  std::map<std::string, int> counts;
  std::string first_function, first_literal;
  static const char* const kCommon[] = {"const",   "return",  "static_cast", "include", "namespace",
                                        "int64_t", "int32_t", "size_t",      "uint8_t", "std",
                                        "string",  "vector",  "tandem",      "double",  "struct",
                                        "public",  "private", "override",    "nullptr", "status"};
  bool line_start = true, in_directive = false, in_comment = false;
  for (size_t i = 0; i < code.size();) {
    const char c = code[i];
    if (c == '\n') {
      line_start = true;
      in_directive = in_comment = false;
      ++i;
      continue;
    }
    if (line_start && c == '#') in_directive = true;
    if (c == '/' && i + 1 < code.size() && code[i + 1] == '/') in_comment = true;
    line_start = false;
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t end = i;
      while (end < code.size() &&
             (std::isalnum(static_cast<unsigned char>(code[end])) || code[end] == '_')) {
        ++end;
      }
      const std::string word = code.substr(i, end - i);
      if (!in_directive && !in_comment) {
        bool common = false;
        for (const char* k : kCommon) common = common || word == k;
        if (!common && word.size() >= 6) ++counts[word];
        // A definition's name: the last identifier before '(' on a line
        // that starts at column 0 (not a statement inside a body).
        if (first_function.empty() && end < code.size() && code[end] == '(' && !common) {
          const size_t line_begin = code.rfind('\n', i) + 1;
          if (!std::isspace(static_cast<unsigned char>(code[line_begin])) && word != "TEST") {
            first_function = word;
          }
        }
      }
      i = end;
      continue;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t end = i;
      while (end < code.size() && std::isdigit(static_cast<unsigned char>(code[end]))) ++end;
      if (first_literal.empty() && !in_directive && !in_comment && end - i >= 2 && end - i <= 9) {
        first_literal = code.substr(i, end - i);
      }
      i = end;
      continue;
    }
    ++i;
  }
  std::string frequent;
  int best = 0;
  for (const auto& [word, n] : counts) {
    if (n > best) best = n, frequent = word;
  }
  if (kind == 1 && !first_function.empty()) {
    return "Add a last parameter `bool verbose` to the function `" + first_function +
           "` (and pass `false` wherever the file calls it)";
  }
  if (kind == 2 && !first_literal.empty()) {
    return "Change the number " + first_literal + " to " +
           std::to_string(2 * std::stoll(first_literal)) + " everywhere in the file";
  }
  const std::string renamed =
      frequent + (std::isupper(static_cast<unsigned char>(frequent[0])) ? "V2" : "_v2");
  return "Rename `" + frequent + "` to `" + renamed + "` everywhere";
}

std::string FirstEditMessage(const std::string& file, const std::string& instruction) {
  return "Here is a source file:\n```cpp\n" + file + "```\n" + instruction +
         ", and return the whole file.";
}

std::string AnswerCode(const std::string& answer) {
  const size_t open = answer.find("```");
  if (open == std::string::npos) return answer;
  const size_t body = answer.find('\n', open);
  if (body == std::string::npos) return answer;
  const size_t close = answer.find("```", body + 1);
  return answer.substr(body + 1, close == std::string::npos ? std::string::npos : close - body - 1);
}

namespace {
// The non-blank lines of `text`, trimmed, with how often each occurs.
std::map<std::string, int> TrimmedLines(const std::string& text) {
  std::map<std::string, int> lines;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    const size_t first = text.find_first_not_of(" \t\r", begin);
    if (first != std::string::npos && first < end) {
      const size_t last = text.find_last_not_of(" \t\r", end - 1);
      ++lines[text.substr(first, last + 1 - first)];
    }
    begin = end + 1;
  }
  return lines;
}
}  // namespace

LinesKept CountLinesKept(const std::string& file, const std::string& code) {
  const std::map<std::string, int> sent = TrimmedLines(file);
  const std::map<std::string, int> answered = TrimmedLines(code);
  LinesKept result;
  for (const auto& [line, count] : sent) {
    result.lines += count;
    const auto it = answered.find(line);
    if (it != answered.end()) result.kept += std::min(count, it->second);
  }
  return result;
}

}  // namespace tandem::bench
