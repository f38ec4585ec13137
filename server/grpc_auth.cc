#include "server/grpc_auth.h"

#include <optional>
#include <string>
#include <string_view>

#include "common/check.h"

namespace tandem::server {
namespace {

struct ProcessorState {
  std::shared_ptr<const ApiKeys> keys;
  std::function<void()> on_refused;
};

std::string_view View(const grpc_slice& slice) {
  return {reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(slice)), GRPC_SLICE_LENGTH(slice)};
}

// gRPC calls this for every call's initial metadata (":path" included) on
// its own threads; it must not block, and does not.
void Process(void* state, grpc_auth_context* /*context*/, const grpc_metadata* md, size_t num_md,
             grpc_process_auth_metadata_done_cb done, void* user_data) {
  const auto* s = static_cast<const ProcessorState*>(state);
  std::string_view path;
  std::optional<std::string_view> authorization;
  for (size_t i = 0; i < num_md; ++i) {
    const std::string_view key = View(md[i].key);
    if (key == ":path") path = View(md[i].value);
    if (key == "authorization") authorization = View(md[i].value);
  }
  const absl::Status status = s->keys->Check(path, authorization);
  if (status.ok()) {
    done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_OK, nullptr);
    return;
  }
  if (s->on_refused) s->on_refused();
  const std::string message(status.message());
  done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_UNAUTHENTICATED, message.c_str());
}

void Destroy(void* state) { delete static_cast<ProcessorState*>(state); }

// grpc::ServerCredentials over credentials made with gRPC's C API, which
// (unlike grpc::InsecureServerCredentials) accept an auth metadata
// processor without TLS.
class CoreCredentials final : public grpc::ServerCredentials {
 public:
  explicit CoreCredentials(grpc_server_credentials* core) : core_(core) {}
  ~CoreCredentials() override { grpc_server_credentials_release(core_); }

  void SetAuthMetadataProcessor(const std::shared_ptr<grpc::AuthMetadataProcessor>&) override {
    TANDEM_CHECK(false, "set the processor through CoreServerCredentials");
  }

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    return grpc_server_add_http2_port(server, addr.c_str(), core_);
  }

  grpc_server_credentials* core_;
};

}  // namespace

std::shared_ptr<grpc::ServerCredentials> CoreServerCredentials(grpc_server_credentials* core,
                                                               std::shared_ptr<const ApiKeys> keys,
                                                               std::function<void()> on_refused) {
  if (keys != nullptr) {
    grpc_auth_metadata_processor processor;
    processor.process = Process;
    processor.destroy = Destroy;
    processor.state = new ProcessorState{std::move(keys), std::move(on_refused)};
    grpc_server_credentials_set_auth_metadata_processor(core, processor);
  }
  return std::make_shared<CoreCredentials>(core);
}

}  // namespace tandem::server
