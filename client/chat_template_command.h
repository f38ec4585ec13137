// `tandem chat-template --model=GGUF [--template_file=F] < conversation.json`:
// prints the prompt the daemon would give the model for a conversation, as
// its chat template renders it (for debugging templates; the reference
// tests compare it with transformers). conversation.json is an object in
// the OpenAI shapes: {"messages": [...], "tools": [...],
// "add_generation_prompt": true}.
#ifndef TANDEM_CLIENT_CHAT_TEMPLATE_COMMAND_H_
#define TANDEM_CLIENT_CHAT_TEMPLATE_COMMAND_H_

#include <istream>
#include <ostream>
#include <string>

namespace tandem::client {

// Returns the exit code: 0 rendered, 1 the template refused the
// conversation or the model cannot be read, 2 bad input. Errors go to `err`.
int RunChatTemplateCommand(const std::string& model_path, const std::string& template_file,
                           std::istream& in, std::ostream& out, std::ostream& err);

}  // namespace tandem::client

#endif  // TANDEM_CLIENT_CHAT_TEMPLATE_COMMAND_H_
