// jinja2's built-in filters, tests and globals, transformers' additions
// (tojson, raise_exception, strftime_now), and the Python methods templates
// call on strings, dicts and lists, with the sandbox's rules for attributes.
#ifndef TANDEM_ENGINE_TOKENIZER_JINJA_BUILTINS_H_
#define TANDEM_ENGINE_TOKENIZER_JINJA_BUILTINS_H_

#include <string>
#include <string_view>

#include "engine/tokenizer/jinja/value.h"

namespace tandem::jinja {

// Names as the parser checks them.
enum class Availability { kUnknown, kSupported, kUnsupported };
Availability FilterAvailability(std::string_view name);
Availability TestAvailability(std::string_view name);

// Applies a filter or a test by name (fails where the name is unknown).
Value ApplyFilter(Interpreter& in, std::string_view name, Value input, CallArgs args);
bool ApplyTest(Interpreter& in, std::string_view name, const Value& input, CallArgs args);

// jinja2's environment.getattr (obj.name) and getitem (obj[key]) under the
// immutable sandbox: methods, dict keys, sequence items, and Undefined where
// nothing matches.
Value GetAttr(const Value& obj, std::string_view name);
Value GetItem(const Value& obj, const Value& key);
// getattr(obj, name) alone, without the fallback to obj[name] (the attr filter).
Value GetAttrOnly(const Value& obj, std::string_view name);
// obj[start:stop:step] on str, list and tuple (null pointers: omitted).
Value Slice(const Value& obj, const Value* start, const Value* stop, const Value* step);
// Calls obj.name(args) when obj has a Python method of that name; false
// when it has none (then obj.name is looked up as an attribute).
bool CallMethod(Interpreter& in, const Value& obj, std::string_view name, CallArgs& args,
                Value* result);

// The globals: range, dict, namespace, cycler, joiner, raise_exception,
// strftime_now. False when there is no such global.
bool LookupGlobal(std::string_view name, Value* out);

// tojson as transformers defines it: json.dumps(x, ensure_ascii=False,
// indent=None, separators=None, sort_keys=False).
std::string ToJson(const Value& v, bool ensure_ascii, const Value& indent, const Value& separators,
                   bool sort_keys);

}  // namespace tandem::jinja

#endif  // TANDEM_ENGINE_TOKENIZER_JINJA_BUILTINS_H_
