// Whole-file edits, what a coding agent asks a model for most: a source file
// of the repository sent in a chat and asked back whole with one change.
// Shared by `tandem bench`'s file-edit task and tandem-spec-bench's edits and
// session workloads, so both measure the same requests.
#ifndef TANDEM_CLIENT_BENCH_FILE_EDITS_H_
#define TANDEM_CLIENT_BENCH_FILE_EDITS_H_

#include <string>
#include <vector>

namespace tandem::bench {

// The C++ sources (.cc, .h) the "code" corpus is made of: engine/,
// scheduler/, server/ and kvcache/ under `source_dir`, sorted by path.
std::vector<std::string> CodeFilePaths(const std::string& source_dir);

// One change to ask for in `code`, of kind `kind % 3`:
//   0: rename the file's most frequent identifier of 6+ characters (outside
//      comments and #-directives, common words of C++ left out) everywhere;
//   1: add a last parameter `bool verbose` to its first function defined at
//      column 0 (and pass `false` where it is called);
//   2: change its first integer literal of 2+ digits to twice its value
//      everywhere.
// A kind the file gives nothing for falls back to the rename. The text is
// an imperative without a final full stop ("Rename `a` to `a_v2` everywhere").
std::string EditInstruction(const std::string& code, int kind);

// The first turn's user message: `file` in a cpp code fence, then
// `instruction` and the request to return the whole file.
std::string FirstEditMessage(const std::string& file, const std::string& instruction);

// The code of an answer: the contents of its first code fence (```lang
// ... ```; an unclosed fence runs to the end), else the whole answer. What
// an agent writes back to the file.
std::string AnswerCode(const std::string& answer);

// How much of a file an answer reproduced: of `file`'s non-blank lines
// (compared without leading and trailing white space), how many `code`
// holds too, each line of `code` matching at most one. An edit keeps nearly
// all; an answer that talks about the file or repeats itself keeps few.
struct LinesKept {
  int lines = 0;
  int kept = 0;
};
LinesKept CountLinesKept(const std::string& file, const std::string& code);

}  // namespace tandem::bench

#endif  // TANDEM_CLIENT_BENCH_FILE_EDITS_H_
