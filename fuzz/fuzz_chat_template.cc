// Chat templates on arbitrary conversations: Validate() accepts or refuses
// with a status; what it accepts renders and encodes without crashing, in
// every template family.
#include <cstdint>
#include <string>
#include <vector>

#include "engine/tokenizer/chat_template.h"
#include "fuzz/fuzz_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using tandem::tokenizer::ChatMessage;
  using tandem::tokenizer::ChatTemplate;
  static const char* kRoles[] = {"system", "user", "assistant", "tool", ""};
  // Messages separated by 0 bytes; each starts with a byte choosing its role
  // (or, above 4, an arbitrary role made of the next bytes up to a 1 byte).
  std::vector<ChatMessage> messages;
  size_t i = 0;
  while (i < size && messages.size() < 16) {
    ChatMessage m;
    const uint8_t r = data[i++];
    if (r < 5) {
      m.role = kRoles[r];
    } else {
      while (i < size && data[i] != 1) m.role.push_back(static_cast<char>(data[i++]));
      ++i;
    }
    while (i < size && data[i] != 0) m.content.push_back(static_cast<char>(data[i++]));
    ++i;
    messages.push_back(std::move(m));
  }
  const auto& model = tandem::fuzz::Model();
  for (const char* family : {"", "chatml", "llama3"}) {
    // "": the model's own template, run by the Jinja interpreter.
    auto chat = ChatTemplate::Create(model.template_text, family, model.tokenizer.get());
    if (!chat.ok()) continue;
    if (!chat->Validate(messages).ok()) continue;
    (void)chat->Render(messages);
    (void)chat->Encode(*model.tokenizer, messages);
  }
  return 0;
}
