// tandem-jinja-render TEMPLATE_FILE [--now=UNIX_SECONDS] < context.json
//
// Renders a Jinja chat template with our interpreter: the JSON object on
// stdin holds the variables; the rendered text goes to stdout, an error to
// stderr with exit status 1. --now fixes what strftime_now() sees.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "absl/time/time.h"
#include "engine/tokenizer/jinja/jinja.h"
#include "nlohmann/json.hpp"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: tandem-jinja-render TEMPLATE_FILE [--now=UNIX_SECONDS] < context.json\n";
    return 2;
  }
  tandem::jinja::RenderOptions options;
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--now=", 0) == 0) {
      options.now =
          absl::FromUnixMicros(static_cast<int64_t>(std::strtod(arg.c_str() + 6, nullptr) * 1e6));
    } else {
      std::cerr << "unknown argument: " << arg << "\n";
      return 2;
    }
  }
  std::ifstream file(argv[1], std::ios::binary);
  if (!file) {
    std::cerr << "cannot read " << argv[1] << "\n";
    return 1;
  }
  std::stringstream source;
  source << file.rdbuf();
  nlohmann::ordered_json context;
  try {
    context = nlohmann::ordered_json::parse(std::cin);
  } catch (const std::exception& e) {
    std::cerr << "invalid JSON context: " << e.what() << "\n";
    return 1;
  }
  auto tmpl = tandem::jinja::Template::Parse(source.str());
  if (!tmpl.ok()) {
    std::cerr << tmpl.status().message() << "\n";
    return 1;
  }
  auto text = tmpl->Render(context, options);
  if (!text.ok()) {
    std::cerr << text.status().message() << "\n";
    return 1;
  }
  std::fwrite(text->data(), 1, text->size(), stdout);
  return 0;
}
