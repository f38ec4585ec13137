#include "engine/kernels/cuda/cuda_backend.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>

#include "common/strings.h"
#include "engine/kernels/cpu/to_bf16.h"
#include "engine/kernels/cuda/attention_rows.h"
#include "engine/kernels/cuda/cuda_check.h"
#include "engine/kernels/cuda/kernels.h"
#include "engine/kernels/cuda/skinny_matmul.h"

namespace tandem::kernels::cuda {
namespace {

// Bump whenever a CUDA kernel's rounding changes (arithmetic()).
constexpr int kKernelRevision = 1;

// Device memory that frees itself on its device.
absl::StatusOr<std::unique_ptr<DeviceBuffer>> DeviceAlloc(int device, size_t bytes,
                                                          const char* what) {
  void* data = nullptr;
  const cudaError_t error = cudaMalloc(&data, std::max<size_t>(bytes, 1));
  if (error != cudaSuccess) {
    cudaGetLastError();  // an allocation failure is not sticky; clear it
    return absl::ResourceExhaustedError(StrCat("cannot allocate ", bytes, " bytes of GPU ", device,
                                               " memory for ", what, ": ",
                                               cudaGetErrorString(error)));
  }
  return std::make_unique<DeviceBuffer>(data, bytes, [device](void* p) {
    cudaSetDevice(device);
    cudaFree(p);
  });
}

// The device copies of host tensors, one per (device, host data, type,
// shape, stored form, content fingerprint) for the whole process, so the two
// lanes' backends hold one copy of the model. Entries die with their last
// user. The fingerprint (below) keeps a different tensor that later sits at
// the same host address from being served a stale copy.
using WeightKey = std::tuple<int, const void*, DType, int64_t, int64_t, bool, uint64_t>;

// FNV-1a over the whole of a small tensor, or over 64 evenly spread 256-byte
// pieces of a large one (a weight file's tensors are immutable while mapped;
// this guards against reused addresses, not against edits in place).
uint64_t Fingerprint(const void* data, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t hash = 1469598103934665603ull;
  auto mix = [&](size_t from, size_t count) {
    for (size_t i = from; i < from + count; ++i) hash = (hash ^ p[i]) * 1099511628211ull;
  };
  constexpr size_t kPiece = 256, kPieces = 64;
  if (bytes <= kPiece * kPieces) {
    mix(0, bytes);
  } else {
    for (size_t k = 0; k < kPieces; ++k) mix((bytes - kPiece) / (kPieces - 1) * k, kPiece);
  }
  return hash ^ bytes;
}

absl::StatusOr<std::shared_ptr<DeviceBuffer>> SharedDeviceCopy(
    const WeightKey& key, size_t bytes, const std::function<absl::Status(DeviceBuffer&)>& fill) {
  static std::mutex mu;
  static auto* copies = new std::map<WeightKey, std::weak_ptr<DeviceBuffer>>();  // guarded by mu
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = copies->find(key); it != copies->end()) {
    if (std::shared_ptr<DeviceBuffer> live = it->second.lock()) return live;
  }
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> made =
      DeviceAlloc(std::get<0>(key), bytes, "weights");
  if (!made.ok()) return made.status();
  std::shared_ptr<DeviceBuffer> buffer = *std::move(made);
  if (absl::Status s = fill(*buffer); !s.ok()) return s;
  (*copies)[key] = buffer;
  return buffer;
}

// A whole host array into `buffer`, landed when this returns (from pageable
// memory cudaMemcpy may return before its DMA does).
absl::Status CopyToDevice(DeviceBuffer& buffer, const void* host, size_t bytes) {
  cudaError_t e = cudaMemcpy(buffer.data(), host, bytes, cudaMemcpyHostToDevice);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) return absl::InternalError(cudaGetErrorString(e));
  return absl::OkStatus();
}

int HostThreads() { return std::max(1u, std::thread::hardware_concurrency()); }

// A launch that could not start (bad configuration, too much shared memory)
// leaves an error only cudaGetLastError() returns; its outputs would keep
// stale values. Legal inside a stream capture.
void CheckLaunch(const char* what) { CheckCuda(cudaGetLastError(), what); }

// MatMul's product as one launch of the few-row kernel, if it fits
// (SkinnyMatMulFits; every weight over x's columns).
std::optional<SkinnyMatMulArgs> SkinnyArgs(const uint16_t* x_bf16, const Matrix& x,
                                           std::span<const Weight* const> weights,
                                           std::span<const Weight* const> biases,
                                           std::span<const Matrix> outs) {
  if (x.rows > SkinnyMatMulArgs::kMaxRows || weights.size() > SkinnyMatMulArgs::kMaxWeights) {
    return std::nullopt;
  }
  SkinnyMatMulArgs args;
  args.x = x_bf16;
  args.rows = static_cast<int>(x.rows);
  args.k = x.cols;
  args.weights = static_cast<int>(weights.size());
  for (size_t i = 0; i < weights.size(); ++i) {
    const Weight& w = *weights[i];
    if (w.cols != x.cols) return std::nullopt;
    args.w[i] = static_cast<const uint16_t*>(w.packed);
    args.n[i] = w.rows;
    args.out[i] = outs[i].data;
    args.ld[i] = outs[i].cols;
    if (i < biases.size() && biases[i] != nullptr) {
      args.bias[i] = static_cast<const float*>(biases[i]->data);
    }
  }
  if (!SkinnyMatMulFits(args)) return std::nullopt;
  return args;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(int device, LanePriority lane,
                                                                 int decode_sms) {
  std::unique_ptr<CudaBackend> backend(new CudaBackend(device, lane, decode_sms));
  if (absl::Status s = backend->Init(); !s.ok()) return s;
  return backend;
}

absl::Status CudaBackend::Init() {
  if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
    return absl::FailedPreconditionError(
        StrCat("cannot use CUDA device ", device_, ": ", cudaGetErrorString(e)));
  }
  cudaDeviceProp prop{};
  if (cudaError_t e = cudaGetDeviceProperties(&prop, device_); e != cudaSuccess) {
    return absl::FailedPreconditionError(
        StrCat("cannot read CUDA device ", device_, ": ", cudaGetErrorString(e)));
  }
  multiprocessors_ = prop.multiProcessorCount;
  int least = 0, greatest = 0;
  CheckCuda(cudaDeviceGetStreamPriorityRange(&least, &greatest),
            "cudaDeviceGetStreamPriorityRange");
  const int priority = lane_ == LanePriority::kLatency ? greatest : least;
  CheckCuda(cudaStreamCreateWithPriority(&own_stream_, cudaStreamNonBlocking, priority),
            "cudaStreamCreateWithPriority");
  stream_ = own_stream_;
  if (cublasStatus_t s = cublasCreate(&cublas_); s != CUBLAS_STATUS_SUCCESS) {
    return absl::FailedPreconditionError(StrCat("cuBLAS: ", cublasGetStatusString(s)));
  }
  CheckCublas(cublasSetStream(cublas_, stream_), "cublasSetStream");
  // cuBLAS's own workspace would be allocated on first use, which a stream
  // capture cannot do; 32 MiB is what it asks for on Hopper.
  constexpr size_t kCublasWorkspace = size_t{32} << 20;
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> workspace =
      DeviceAlloc(device_, kCublasWorkspace, "cuBLAS workspace");
  if (!workspace.ok()) return workspace.status();
  cublas_workspace_ = *std::move(workspace);
  CheckCublas(cublasSetWorkspace(cublas_, cublas_workspace_->data(), kCublasWorkspace),
              "cublasSetWorkspace");
  if (absl::Status s = uploads_.Init(size_t{1} << 20, stream_); !s.ok()) return s;
  // The lanes' SM partition: the decode lane records when it is busy, the
  // prefill lane keeps to a partition without the reserved SMs meanwhile.
  std::string partition;
  if (const int reserved = DecodeReservedSms(multiprocessors_, decode_sms_flag_); reserved > 0) {
    if (lane_ == LanePriority::kLatency) {
      decode_activity_ = LatencyLaneActivity::ForDevice(device_);
      partition = StrCat(", marks ", reserved, " SMs free of prefill while it runs");
    } else if (absl::StatusOr<std::unique_ptr<GreenPartition>> made =
                   GreenPartition::Create(device_, reserved, priority);
               made.ok()) {
      narrowed_ = *std::move(made);
      decode_activity_ = LatencyLaneActivity::ForDevice(device_);
      CheckCuda(cudaEventCreateWithFlags(&switch_event_, cudaEventDisableTiming),
                "cudaEventCreateWithFlags");
      CheckCuda(cudaEventCreateWithFlags(&ahead_event_, cudaEventDisableTiming),
                "cudaEventCreateWithFlags");
      partition = StrCat(", ", narrowed_->sms(), " of ", narrowed_->device_sms(),
                         " SMs (a green context) while decode runs");
    } else {
      partition = StrCat(", no SM partition (", made.status().message(), ")");
    }
  }
  name_ = StrCat("cuda (", prop.name, ", sm_", prop.major, prop.minor, ", ", multiprocessors_,
                 " SMs, ", lane_ == LanePriority::kLatency ? "high" : "low", "-priority stream",
                 partition, ", cuBLAS bf16 matmul)");
  // cuBLAS chooses its algorithms by device (and its SM count): another
  // model of GPU may round differently.
  arithmetic_ = StrCat("cuda-", prop.name, "-", multiprocessors_, "sms/bf16/r", kKernelRevision);
  return absl::OkStatus();
}

absl::Duration CudaBackend::BeginStep() {
  if (lane_ == LanePriority::kLatency && decode_activity_ != nullptr) {
    decode_activity_->StepBegan(LatencyLaneActivity::Clock::now());
  }
  return absl::ZeroDuration();
}

void CudaBackend::FollowDecodeLane() {
  if (narrowed_ == nullptr || mode_ != Mode::kIssue || in_step_) return;
  // Without a bound the host would queue a whole prefill chunk at once, and
  // a decode step starting later would find it all on the whole device. The
  // event was recorded before the previous call: once it has passed, only
  // that call is queued, and this one joins it (two in flight at most).
  if (ahead_recorded_) {
    CheckCuda(cudaEventSynchronize(ahead_event_), "cudaEventSynchronize (run-ahead)");
  }
  UseStream(decode_activity_->Busy(LatencyLaneActivity::Clock::now()) ? narrowed_->stream()
                                                                      : own_stream_);
  RecordEvent(ahead_event_, "cudaEventRecord (run-ahead)");
  ahead_recorded_ = true;
}

void CudaBackend::RecordEvent(cudaEvent_t event, const char* what) {
  if (OnPartition()) {
    if (absl::Status s = narrowed_->RecordEvent(event); !s.ok()) {
      CheckCuda(cudaErrorInvalidResourceHandle, std::string(s.message()).c_str());
    }
    return;
  }
  CheckCuda(cudaEventRecord(event, stream_), what);
}

void CudaBackend::UseStream(cudaStream_t next) {
  if (next == stream_) return;
  // Waiting for an event of another context (the green one) is allowed.
  RecordEvent(switch_event_, "cudaEventRecord (stream switch)");
  CheckCuda(cudaStreamWaitEvent(next, switch_event_, 0), "cudaStreamWaitEvent (stream switch)");
  stream_ = next;
  CheckCublas(cublasSetStream(cublas_, stream_), "cublasSetStream");
  // cublasSetStream puts cuBLAS back on its default workspace, which it
  // would allocate on first use: ours again.
  CheckCublas(cublasSetWorkspace(cublas_, cublas_workspace_->data(), cublas_workspace_->bytes()),
              "cublasSetWorkspace");
  // cuBLAS sizes its grids for the SMs it may use: the partition's, or (0)
  // the whole device's.
  CheckCublas(cublasSetSmCountTarget(cublas_, OnPartition() ? narrowed_->sms() : 0),
              "cublasSetSmCountTarget");
  uploads_.set_stream(stream_);
}

CudaBackend::~CudaBackend() {
  // The current stream has waited for everything issued before a switch.
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  for (auto& [key, recording] : recordings_) cudaGraphExecDestroy(recording.exec);
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  // Buffers that kernels on the stream used go before the stream does.
  bf16_activations_.reset();
  attention_partial_.reset();
  cublas_workspace_.reset();
  argmax_tokens_.reset();
  sampling_weights_.reset();
  nucleus_shares_.reset();
  logprobs_.reset();
  for (cudaEvent_t event : {switch_event_, ahead_event_}) {
    if (event != nullptr) cudaEventDestroy(event);
  }
  narrowed_.reset();
  if (own_stream_ != nullptr) cudaStreamDestroy(own_stream_);
}

absl::Duration CudaBackend::EndStep() {
  // A step without logits issues work and returns without waiting; the
  // scheduler may then free its blocks and hand them to the other lane,
  // whose stream would not wait for this one's KV writes. So a step ends
  // when its work has.
  CheckCuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (end of step)");
  uploads_.Reset();
  if (lane_ == LanePriority::kLatency && decode_activity_ != nullptr) {
    decode_activity_->StepEnded(LatencyLaneActivity::Clock::now());
  }
  return absl::ZeroDuration();
}

void CudaBackend::BindCallingThread() { CheckCuda(cudaSetDevice(device_), "cudaSetDevice"); }

absl::StatusOr<std::unique_ptr<DeviceBuffer>> CudaBackend::Allocate(size_t bytes) {
  return DeviceAlloc(device_, bytes, "activations");
}

absl::StatusOr<int64_t> CudaBackend::FreeMemoryBytes() const {
  size_t free = 0, total = 0;
  if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
    return absl::InternalError(StrCat("cudaSetDevice(", device_, "): ", cudaGetErrorString(e)));
  }
  if (cudaError_t e = cudaMemGetInfo(&free, &total); e != cudaSuccess) {
    return absl::InternalError(StrCat("cudaMemGetInfo: ", cudaGetErrorString(e)));
  }
  return static_cast<int64_t>(free);
}

int64_t CudaBackend::WeightBytes(DType dtype, int64_t rows, int64_t cols) const {
  const int64_t elements = rows * cols;
  if (dtype != DType::kF32) return elements * 2;
  return elements * 4 + (rows > 1 ? elements * 2 : 0);
}

absl::StatusOr<Weight> CudaBackend::UploadWeight(DType dtype, int64_t rows, int64_t cols,
                                                 const void* host_data) {
  Weight weight{dtype, rows, cols, nullptr, nullptr};
  const size_t elements = static_cast<size_t>(rows * cols);
  const uint64_t fingerprint =
      Fingerprint(host_data, RowBytes(dtype, cols) * static_cast<size_t>(rows));
  auto bf16_copy = [&]() {
    return SharedDeviceCopy({device_, host_data, dtype, rows, cols, true, fingerprint},
                            elements * sizeof(uint16_t), [&](DeviceBuffer& buffer) -> absl::Status {
                              std::vector<uint16_t> host(elements);
                              cpu::DequantizeToBf16(dtype, host_data, rows, cols, host.data(),
                                                    HostThreads());
                              return CopyToDevice(buffer, host.data(), elements * sizeof(uint16_t));
                            });
  };
  if (dtype == DType::kF32) {
    // Vectors, the rotary table and small float matrices stay float32; a
    // matrix also gets a bf16 copy for products.
    absl::StatusOr<std::shared_ptr<DeviceBuffer>> f32 =
        SharedDeviceCopy({device_, host_data, dtype, rows, cols, false, fingerprint},
                         elements * sizeof(float), [&](DeviceBuffer& buffer) {
                           return CopyToDevice(buffer, host_data, elements * sizeof(float));
                         });
    if (!f32.ok()) return f32.status();
    weights_.push_back(*f32);
    weight.data = (*f32)->data();
    if (rows > 1) {
      absl::StatusOr<std::shared_ptr<DeviceBuffer>> bf16 = bf16_copy();
      if (!bf16.ok()) return bf16.status();
      weights_.push_back(*bf16);
      weight.packed = (*bf16)->data();
    }
    return weight;
  }
  absl::StatusOr<std::shared_ptr<DeviceBuffer>> bf16 = bf16_copy();
  if (!bf16.ok()) return bf16.status();
  weights_.push_back(*bf16);
  weight.dtype = DType::kBF16;
  weight.data = weight.packed = (*bf16)->data();
  return weight;
}

absl::Status CudaBackend::CreateKvCache(const KvCacheShape& shape) {
  if (shape.head_dim % 32 != 0 || shape.head_dim > 256) {
    return absl::InvalidArgumentError(
        StrCat("the CUDA attention kernel needs a head dimension that is a multiple of 32, at "
               "most 256; the model's is ",
               shape.head_dim));
  }
  kv_storage_.reset();
  const size_t bytes = shape.BytesPerBlock() * static_cast<size_t>(shape.blocks);
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> storage = DeviceAlloc(device_, bytes, "KV cache");
  if (!storage.ok()) return storage.status();
  // Never-written slots read as zeros, as on the CPU.
  // On this backend's stream (non-blocking: the legacy default stream would
  // not order before it), finished before any other lane can use it.
  CheckCuda(cudaMemsetAsync((*storage)->data(), 0, bytes, stream_), "cudaMemsetAsync (KV cache)");
  CheckCuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (KV cache)");
  kv_storage_ = *std::move(storage);
  kv_shape_ = shape;
  ++scratch_generation_;  // recordings hold the old storage's address
  return absl::OkStatus();
}

absl::Status CudaBackend::ShareKvCache(const Backend& other) {
  const auto* cuda = dynamic_cast<const CudaBackend*>(&other);
  if (cuda == nullptr || cuda->kv_storage_ == nullptr || cuda->device_ != device_) {
    return absl::FailedPreconditionError(
        "KV storage can be shared only with a CUDA backend on the same device that has one");
  }
  kv_storage_ = cuda->kv_storage_;
  kv_shape_ = cuda->kv_shape_;
  ++scratch_generation_;
  return absl::OkStatus();
}

KvStorage CudaBackend::kv_storage() const {
  if (kv_storage_ == nullptr) return {};
  return {kv_storage_->data(), kv_storage_->bytes(), /*device=*/true};
}

void CudaBackend::CopyToHost(const Matrix& src, float* dst) {
  CheckCuda(cudaMemcpyAsync(dst, src.data, sizeof(float) * static_cast<size_t>(src.rows * src.cols),
                            cudaMemcpyDeviceToHost, stream_),
            "cudaMemcpyAsync (to host)");
  CheckCuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  uploads_.Reset();
}

void CudaBackend::ArgMaxRows(const Matrix& x, std::span<int32_t> out) {
  auto* tokens = static_cast<int32_t*>(
      OutputScratch(argmax_tokens_, static_cast<size_t>(x.rows) * sizeof(int32_t)));
  LaunchArgMaxRows(x.data, x.rows, x.cols, tokens, stream_);
  CheckLaunch("LaunchArgMaxRows");
  CheckCuda(cudaMemcpyAsync(out.data(), tokens, static_cast<size_t>(x.rows) * sizeof(int32_t),
                            cudaMemcpyDeviceToHost, stream_),
            "cudaMemcpyAsync (tokens to host)");
  CheckCuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  uploads_.Reset();
}

void CudaBackend::SampleRows(const Matrix& x, std::span<const RowDraw> draws,
                             std::span<int32_t> tokens) {
  SampleOnDevice(x, draws, tokens, {}, {});
}

void CudaBackend::SampleRowsWithShares(const Matrix& x, std::span<const RowDraw> draws,
                                       std::span<int32_t> tokens,
                                       std::span<const int32_t> share_tokens,
                                       std::span<NucleusShare> shares) {
  SampleOnDevice(x, draws, tokens, share_tokens, shares);
}

void CudaBackend::SampleOnDevice(const Matrix& x, std::span<const RowDraw> draws,
                                 std::span<int32_t> tokens, std::span<const int32_t> share_tokens,
                                 std::span<NucleusShare> shares) {
  const auto rows = static_cast<size_t>(x.rows);
  const auto cols = static_cast<size_t>(x.cols);
  // Launches of at most this many rows share one weight scratch (8 bytes a
  // logit: 263 MB for a 128k vocabulary), whatever the step's row count.
  constexpr size_t kRowsPerLaunch = 256;
  auto* device_tokens =
      static_cast<int32_t*>(OutputScratch(argmax_tokens_, rows * sizeof(int32_t)));
  // Greedy rows never touch the weights: an all-greedy step needs none.
  const bool sampled = std::any_of(draws.begin(), draws.end(),
                                   [](const RowDraw& d) { return d.temperature > 0.0f; });
  auto* weights =
      sampled ? static_cast<uint64_t*>(OutputScratch(
                    sampling_weights_, std::min(rows, kRowsPerLaunch) * cols * sizeof(uint64_t)))
              : nullptr;
  static_assert(sizeof(RowDraw) % sizeof(int32_t) == 0 && alignof(RowDraw) <= 256);
  const std::span<const int32_t> draw_words(reinterpret_cast<const int32_t*>(draws.data()),
                                            rows * sizeof(RowDraw) / sizeof(int32_t));
  const bool with_shares = !share_tokens.empty();
  const RowDraw* device_draws = nullptr;
  const int32_t* device_share_tokens = nullptr;
  if (with_shares) {  // both copies must stay valid: one call
    const auto [d, t] = uploads_.UploadPair(UploadArena::Kind::kDraws, draw_words,
                                            UploadArena::Kind::kTokens, share_tokens);
    device_draws = reinterpret_cast<const RowDraw*>(d);
    device_share_tokens = t;
  } else {
    device_draws =
        reinterpret_cast<const RowDraw*>(uploads_.Upload(UploadArena::Kind::kDraws, draw_words));
  }
  auto* device_shares =
      with_shares
          ? static_cast<NucleusShare*>(OutputScratch(nucleus_shares_, rows * sizeof(NucleusShare)))
          : nullptr;
  for (size_t first = 0; first < rows; first += kRowsPerLaunch) {
    const size_t count = std::min(kRowsPerLaunch, rows - first);
    LaunchSampleRows(x.data + first * cols, static_cast<int64_t>(count), x.cols,
                     device_draws + first, weights, device_tokens + first,
                     with_shares ? device_share_tokens + first : nullptr,
                     with_shares ? device_shares + first : nullptr, stream_);
    CheckLaunch("LaunchSampleRows");
  }
  CheckCuda(cudaMemcpyAsync(tokens.data(), device_tokens, rows * sizeof(int32_t),
                            cudaMemcpyDeviceToHost, stream_),
            "cudaMemcpyAsync (tokens to host)");
  if (with_shares) {
    CheckCuda(cudaMemcpyAsync(shares.data(), device_shares, rows * sizeof(NucleusShare),
                              cudaMemcpyDeviceToHost, stream_),
              "cudaMemcpyAsync (nucleus shares to host)");
  }
  CheckCuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  uploads_.Reset();
}

void CudaBackend::LogprobRows(const Matrix& x, std::span<const int32_t> tokens, int top,
                              std::span<float> token_logprobs, std::span<int32_t> top_ids,
                              std::span<float> top_logprobs) {
  if (top > kMaxDeviceLogprobs) {
    Backend::LogprobRows(x, tokens, top, token_logprobs, top_ids, top_logprobs);
    return;
  }
  const auto rows = static_cast<size_t>(x.rows);
  const size_t alternatives = rows * static_cast<size_t>(top);
  // One buffer: [rows] token logprobs, then [alternatives] ids, then values.
  auto* out =
      static_cast<char*>(OutputScratch(logprobs_, (rows + 2 * alternatives) * sizeof(float)));
  auto* device_token_logprobs = reinterpret_cast<float*>(out);
  auto* device_ids = reinterpret_cast<int32_t*>(out + rows * sizeof(float));
  auto* device_values = reinterpret_cast<float*>(out + (rows + alternatives) * sizeof(float));
  const int32_t* device_tokens = uploads_.Upload(UploadArena::Kind::kTokens, tokens);
  LaunchLogprobRows(x.data, x.rows, x.cols, device_tokens, top, device_token_logprobs, device_ids,
                    device_values, stream_);
  CheckLaunch("LaunchLogprobRows");
  CheckCuda(cudaMemcpyAsync(token_logprobs.data(), device_token_logprobs, rows * sizeof(float),
                            cudaMemcpyDeviceToHost, stream_),
            "cudaMemcpyAsync (logprobs to host)");
  if (alternatives > 0) {
    CheckCuda(cudaMemcpyAsync(top_ids.data(), device_ids, alternatives * sizeof(int32_t),
                              cudaMemcpyDeviceToHost, stream_),
              "cudaMemcpyAsync (logprobs to host)");
    CheckCuda(cudaMemcpyAsync(top_logprobs.data(), device_values, alternatives * sizeof(float),
                              cudaMemcpyDeviceToHost, stream_),
              "cudaMemcpyAsync (logprobs to host)");
  }
  CheckCuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  uploads_.Reset();
}

void CudaBackend::CopyFromHost(const float* src, Matrix dst) {
  // From pageable memory the call returns once `src` has been staged.
  CheckCuda(cudaMemcpyAsync(dst.data, src, sizeof(float) * static_cast<size_t>(dst.rows * dst.cols),
                            cudaMemcpyHostToDevice, stream_),
            "cudaMemcpyAsync (from host)");
}

void* CudaBackend::OutputScratch(std::unique_ptr<DeviceBuffer>& buffer, size_t bytes) {
  // Not used inside recordings: growing it leaves them valid.
  const int64_t generation = scratch_generation_;
  void* data = Scratch(buffer, bytes);
  scratch_generation_ = generation;
  return data;
}

void* CudaBackend::Scratch(std::unique_ptr<DeviceBuffer>& buffer, size_t bytes) {
  if (buffer == nullptr || buffer->bytes() < bytes) {
    if (mode_ != Mode::kIssue) {
      // The step's first run sized every buffer for its key.
      CheckCuda(cudaErrorInvalidValue, "scratch growth inside a recorded step");
    }
    ++scratch_generation_;
    // Kernels queued earlier may still read the old buffer.
    CheckCuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (scratch)");
    const size_t grown = std::max(bytes, 2 * (buffer ? buffer->bytes() : 0));
    buffer.reset();
    absl::StatusOr<std::unique_ptr<DeviceBuffer>> made = DeviceAlloc(device_, grown, "scratch");
    if (!made.ok()) {
      CheckCuda(cudaErrorMemoryAllocation, std::string(made.status().message()).c_str());
    }
    buffer = *std::move(made);
  }
  return buffer->data();
}

uint16_t* CudaBackend::KPool(int layer) const {
  const int64_t pool =
      int64_t{kv_shape_.blocks} * kv_shape_.block_size * kv_shape_.kv_heads * kv_shape_.head_dim;
  return static_cast<uint16_t*>(kv_storage_->data()) + int64_t{2} * layer * pool;
}

uint16_t* CudaBackend::VPool(int layer) const {
  const int64_t pool =
      int64_t{kv_shape_.blocks} * kv_shape_.block_size * kv_shape_.kv_heads * kv_shape_.head_dim;
  return KPool(layer) + pool;
}

void CudaBackend::Embed(const Weight& table, std::span<const int32_t> ids, Matrix out) {
  const int32_t* device_ids = uploads_.Upload(UploadArena::Kind::kIds, ids);
  if (Replaying()) return;
  const auto rows = static_cast<int64_t>(ids.size());
  if (table.dtype == DType::kBF16) {
    LaunchEmbedBf16(static_cast<const uint16_t*>(table.data), table.cols, device_ids, rows,
                    out.data, stream_);
    CheckLaunch("LaunchEmbedBf16");
  } else {
    LaunchEmbedF32(static_cast<const float*>(table.data), table.cols, device_ids, rows, out.data,
                   stream_);
    CheckLaunch("LaunchEmbedF32");
  }
}

void CudaBackend::MatMul(const Matrix& x, std::span<const Weight* const> weights,
                         std::span<const Weight* const> biases, std::span<const Matrix> outs) {
  if (x.rows == 0) return;
  if (Replaying()) return;
  FollowDecodeLane();
  const int64_t elements = x.rows * x.cols;
  auto* x_bf16 =
      static_cast<uint16_t*>(Scratch(bf16_activations_, static_cast<size_t>(elements) * 2));
  LaunchToBf16(x.data, elements, x_bf16, stream_);
  CheckLaunch("LaunchToBf16");
  // A few rows (decode): every weight in one launch of our kernel, which
  // streams the weights (skinny_matmul.h); more rows: cuBLAS.
  if (std::optional<SkinnyMatMulArgs> skinny = SkinnyArgs(x_bf16, x, weights, biases, outs)) {
    LaunchSkinnyMatMul(*skinny, stream_);
    CheckLaunch("LaunchSkinnyMatMul");
    return;
  }
  const float alpha = 1.0f;
  const float beta = 0.0f;
  for (size_t i = 0; i < weights.size(); ++i) {
    const Weight& w = *weights[i];
    const Matrix& out = outs[i];
    // Row-major out[T][N] = x[T][K] w[N][K]^T is, read column-major,
    // out[N][T] = (w as [K][N])^T (x as [K][T]).
    CheckCublas(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(w.rows),
                             static_cast<int>(x.rows), static_cast<int>(w.cols), &alpha, w.packed,
                             CUDA_R_16BF, static_cast<int>(w.cols), x_bf16, CUDA_R_16BF,
                             static_cast<int>(x.cols), &beta, out.data, CUDA_R_32F,
                             static_cast<int>(out.cols), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                "cublasGemmEx");
    if (i < biases.size() && biases[i] != nullptr) {
      LaunchAddBias(out.data, out.rows, out.cols, static_cast<const float*>(biases[i]->data),
                    stream_);
      CheckLaunch("LaunchAddBias");
    }
  }
}

void CudaBackend::RmsNorm(const Matrix& x, const Weight& weight, float eps, Matrix out) {
  if (Replaying()) return;
  LaunchRmsNorm(x.data, static_cast<const float*>(weight.data), x.rows, x.cols, eps, out.data,
                stream_);
  CheckLaunch("LaunchRmsNorm");
}

void CudaBackend::AddRmsNorm(Matrix acc, const Matrix& x, const Weight& weight, float eps,
                             Matrix out) {
  if (Replaying()) return;
  LaunchAddRmsNorm(acc.data, x.data, static_cast<const float*>(weight.data), acc.rows, acc.cols,
                   eps, out.data, stream_);
  CheckLaunch("LaunchAddRmsNorm");
}

void CudaBackend::Rope(Matrix x, int heads, int head_dim, std::span<const int32_t> positions,
                       const RopeSpec& rope) {
  const int32_t* device_positions = uploads_.Upload(UploadArena::Kind::kPositions, positions);
  if (Replaying()) return;
  LaunchRope(x.data, x.rows, heads, head_dim, device_positions,
             {static_cast<const float*>(rope.table.data), rope.rotary_dims, rope.neox}, stream_);
  CheckLaunch("LaunchRope");
}

void CudaBackend::RopeWriteKv(int layer, Matrix q, Matrix k, const Matrix& v,
                              const AttentionShape& shape, std::span<const int32_t> positions,
                              std::span<const int32_t> slots, const RopeSpec& rope) {
  const auto [device_positions, device_slots] = uploads_.UploadPair(
      UploadArena::Kind::kPositions, positions, UploadArena::Kind::kSlots, slots);
  if (Replaying()) return;
  LaunchRopeWriteKv(q.data, k.data, v.data, q.rows, shape.heads, shape.kv_heads, shape.head_dim,
                    device_positions, device_slots,
                    {static_cast<const float*>(rope.table.data), rope.rotary_dims, rope.neox},
                    KPool(layer), VPool(layer), stream_);
  CheckLaunch("LaunchRopeWriteKv");
}

void CudaBackend::CopyKvBlocks(std::span<const std::pair<int32_t, int32_t>> copies) {
  if (Replaying()) return;
  const int64_t block_halves =
      int64_t{kv_shape_.block_size} * kv_shape_.kv_heads * kv_shape_.head_dim;
  const int64_t pool_halves = block_halves * kv_shape_.blocks;
  // One launch per pair keeps the pairs in order (a later pair may read a
  // block an earlier one wrote).
  for (const auto& [from, to] : copies) {
    LaunchCopyKvBlock(static_cast<uint16_t*>(kv_storage_->data()), 2 * kv_shape_.layers,
                      pool_halves, from * block_halves, to * block_halves, block_halves, stream_);
    CheckLaunch("LaunchCopyKvBlock");
  }
}

void CudaBackend::WriteKv(int layer, const Matrix& k, const Matrix& v,
                          std::span<const int32_t> slots) {
  const int32_t* device_slots = uploads_.Upload(UploadArena::Kind::kSlots, slots);
  if (Replaying()) return;
  LaunchWriteKv(k.data, v.data, k.rows, k.cols, device_slots, KPool(layer), VPool(layer), stream_);
  CheckLaunch("LaunchWriteKv");
}

bool CudaBackend::AttentionInputsKey::Matches(std::span<const AttentionSpan> other,
                                              int64_t other_rows, int64_t other_epoch) const {
  if (other_epoch != epoch || other_rows != rows || other.size() != spans.size()) return false;
  size_t at = 0;
  for (size_t i = 0; i < spans.size(); ++i) {
    const AttentionSpan& a = spans[i];
    const AttentionSpan& b = other[i];
    if (a.first_row != b.first_row || a.rows != b.rows || a.first_position != b.first_position ||
        a.block_table.size() != b.block_table.size()) {
      return false;
    }
    // By content: a later step's table may sit at the same address.
    if (!std::equal(b.block_table.begin(), b.block_table.end(), tables.begin() + at)) return false;
    at += b.block_table.size();
  }
  return true;
}

void CudaBackend::AttentionInputsKey::Set(std::span<const AttentionSpan> new_spans,
                                          int64_t new_rows, int64_t new_epoch) {
  spans.assign(new_spans.begin(), new_spans.end());
  tables.clear();
  for (const AttentionSpan& span : new_spans) {
    tables.insert(tables.end(), span.block_table.begin(), span.block_table.end());
  }
  rows = new_rows;
  epoch = new_epoch;
}

void CudaBackend::Attention(int layer, const Matrix& q, const AttentionShape& shape,
                            std::span<const AttentionSpan> spans, Matrix out) {
  // Every layer of a step attends the same spans: they are packed and
  // uploaded once per step (until the next wait resets the uploads).
  if (!attention_inputs_.key.Matches(spans, q.rows, uploads_.epoch())) {
    // Inside a recorded step the upload's size and the key splits come from
    // the step's spec (the same every time), not from this step's data.
    const size_t min_words =
        in_step_ ? static_cast<size_t>(q.rows) * (2 + static_cast<size_t>(step_.max_blocks_per_row))
                 : 0;
    // Prefill chunks go to the tiled kernel where it has the head dimension.
    const int32_t tile_rows = TiledPrefillSupports(shape.head_dim) ? kPrefillTileRows : 0;
    const AttentionRows packed = PackAttentionRows(spans, q.rows, min_words, tile_rows);
    attention_inputs_.words = uploads_.Upload(UploadArena::Kind::kAttentionRows, packed.words);
    attention_inputs_.max_keys =
        in_step_ ? std::max(packed.max_keys, step_.max_keys) : packed.max_keys;
    attention_inputs_.untiled_rows = packed.untiled_rows;
    attention_inputs_.tile_offset = packed.tile_offset;
    attention_inputs_.tiles = packed.tiles;
    attention_inputs_.key.Set(spans, q.rows, uploads_.epoch());
  }
  if (Replaying()) return;
  FollowDecodeLane();
  AttentionArgs args;
  args.q = q.data;
  args.out = out.data;
  args.k_pool = KPool(layer);
  args.v_pool = VPool(layer);
  args.row_info = attention_inputs_.words;
  args.rows = q.rows;
  args.heads = shape.heads;
  args.kv_heads = shape.kv_heads;
  args.head_dim = shape.head_dim;
  args.block_size = kv_shape_.block_size;
  args.scale = shape.scale;
  args.window = shape.window;
  args.softcap = shape.softcap;
  args.max_keys = attention_inputs_.max_keys;
  args.tiles = args.row_info + attention_inputs_.tile_offset;
  args.tile_count = attention_inputs_.tiles;
  // About four 128-thread blocks per SM: the rows the per-row kernel
  // computes (not those in query tiles) decide whether keys are split; in a
  // recorded step, all its (padded) rows and the spec's keys, so the split,
  // and the scratch it needs, are the same on every step of the key.
  const int64_t split_rows =
      in_step_ ? q.rows : std::max<int64_t>(attention_inputs_.untiled_rows, 1);
  args.splits = ChooseKeySplits(split_rows, shape.heads, args.max_keys, 4 * multiprocessors_);
  // The split states are indexed by every row: cap them at 256 MiB (a long
  // tiled chunk beside a short one with a long context could ask for GBs).
  constexpr size_t kMaxPartialBytes = size_t{256} << 20;
  const size_t per_split = static_cast<size_t>(q.rows) * static_cast<size_t>(shape.heads) *
                           static_cast<size_t>(shape.head_dim + 2) * sizeof(float);
  while (args.splits > 1 && static_cast<size_t>(args.splits) * per_split > kMaxPartialBytes) {
    args.splits /= 2;
  }
  if (args.splits > 1) {
    const size_t floats = static_cast<size_t>(args.splits) * static_cast<size_t>(q.rows) *
                          static_cast<size_t>(shape.heads) *
                          static_cast<size_t>(shape.head_dim + 2);
    args.partial = static_cast<float*>(Scratch(attention_partial_, floats * sizeof(float)));
  }
  LaunchPagedAttention(args, stream_);
  CheckLaunch("LaunchPagedAttention");
}

void CudaBackend::SiluMul(const Matrix& gate, const Matrix& up, Matrix out) {
  if (Replaying()) return;
  LaunchSiluMul(gate.data, up.data, gate.rows * gate.cols, out.data, stream_);
  CheckLaunch("LaunchSiluMul");
}

void CudaBackend::GeluMul(const Matrix& gate, const Matrix& up, Matrix out) {
  if (Replaying()) return;
  LaunchGeluMul(gate.data, up.data, gate.rows * gate.cols, out.data, stream_);
  CheckLaunch("LaunchGeluMul");
}

void CudaBackend::Scale(Matrix x, float factor) {
  if (Replaying()) return;
  LaunchScale(x.data, x.rows * x.cols, factor, stream_);
  CheckLaunch("LaunchScale");
}

void CudaBackend::Softcap(Matrix x, float cap) {
  if (Replaying()) return;
  LaunchSoftcap(x.data, x.rows * x.cols, cap, stream_);
  CheckLaunch("LaunchSoftcap");
}

void CudaBackend::Add(Matrix acc, const Matrix& x) {
  if (Replaying()) return;
  LaunchAdd(acc.data, x.data, acc.rows * acc.cols, stream_);
  CheckLaunch("LaunchAdd");
}

void CudaBackend::GatherRows(const Matrix& x, std::span<const int32_t> rows, Matrix out) {
  const int32_t* device_rows = uploads_.Upload(UploadArena::Kind::kGatherRows, rows);
  if (Replaying()) return;
  LaunchGatherRows(x.data, x.cols, device_rows, static_cast<int64_t>(rows.size()), out.data,
                   stream_);
  CheckLaunch("LaunchGatherRows");
}

void CudaBackend::ScatterAddRows(Matrix acc, std::span<const int32_t> rows,
                                 std::span<const float> weights, const Matrix& x) {
  // The arena carries 32-bit words: the weights go as their bits.
  std::vector<int32_t> weight_bits(weights.size());
  std::memcpy(weight_bits.data(), weights.data(), weights.size() * sizeof(float));
  const auto [device_rows, device_weights] = uploads_.UploadPair(
      UploadArena::Kind::kScatterRows, rows, UploadArena::Kind::kScatterWeights, weight_bits);
  if (Replaying()) return;
  LaunchScatterAddRows(acc.data, x.data, x.cols, device_rows,
                       reinterpret_cast<const float*>(device_weights),
                       static_cast<int64_t>(rows.size()), stream_);
  CheckLaunch("LaunchScatterAddRows");
}

void CudaBackend::RunStep(const StepGraphSpec& spec, const std::function<void()>& ops) {
  // Recorded steps are captured and replayed on the lane's own stream.
  if (narrowed_ != nullptr) UseStream(own_stream_);
  // A recording's copies read the arena from offset 0: the step must start
  // from an empty one (every step before ended with a wait, which empties
  // it; anything else waits here).
  if (!uploads_.empty()) {
    CheckCuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (step)");
    uploads_.Reset();
  }
  in_step_ = true;
  step_ = spec;
  auto done = [this] {
    in_step_ = false;
    mode_ = Mode::kIssue;
    uploads_.set_staging_only(false);
    uploads_.set_may_grow(true);
  };
  // Buffers the owner's recordings used have moved: drop them all (no step
  // is in flight: every step ended with a wait).
  if (auto [it, first] = owner_generations_.try_emplace(spec.owner, spec.generation);
      !first && it->second != spec.generation) {
    it->second = spec.generation;
    for (auto r = recordings_.begin(); r != recordings_.end();) {
      if (r->first.first != spec.owner) {
        ++r;
        continue;
      }
      cudaGraphExecDestroy(r->second.exec);
      r = recordings_.erase(r);
    }
    std::erase_if(warmed_up_, [&](const RecordingKey& k) { return k.first == spec.owner; });
  }
  const RecordingKey key{spec.owner, spec.key};
  if (graphs_failed_ || warmed_up_.insert(key).second) {
    // The key's first step runs eagerly: it grows every buffer to the size
    // the recording will need (growth waits, which a capture cannot). If
    // something grew, the next step warms up again: growth in the middle of
    // a step sizes the arena for what was left of it, not for a whole step
    // from an empty arena.
    const int64_t scratch = scratch_generation_, arena = uploads_.generation();
    ops();
    if (scratch != scratch_generation_ || arena != uploads_.generation()) warmed_up_.erase(key);
    done();
    return;
  }
  auto it = recordings_.find(key);
  if (it != recordings_.end() && (it->second.scratch_generation != scratch_generation_ ||
                                  it->second.arena_generation != uploads_.generation())) {
    cudaGraphExecDestroy(it->second.exec);  // a buffer it uses moved
    recordings_.erase(it);
    it = recordings_.end();
  }
  if (it == recordings_.end()) {
    if (!RecordAndLaunch(key, ops)) {
      // The capture's copies never ran: forget what it staged (the arena
      // was empty when it began), or the eager run would reuse uploads
      // that never reached the device.
      mode_ = Mode::kIssue;
      uploads_.set_may_grow(true);
      uploads_.Reset();
      attention_inputs_.key.epoch = -1;
      ops();
    }
    done();
    return;
  }
  mode_ = Mode::kReplay;
  uploads_.set_staging_only(true);
  uploads_.set_may_grow(false);
  ops();  // stages the step's inputs where the recording's copies read them
  CheckCuda(cudaGraphLaunch(it->second.exec, stream_), "cudaGraphLaunch");
  done();
}

bool CudaBackend::RecordAndLaunch(const RecordingKey& key, const std::function<void()>& ops) {
  // Thread-local capture: the other lane's thread may go on calling CUDA.
  CheckCuda(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
            "cudaStreamBeginCapture");
  mode_ = Mode::kRecord;
  uploads_.set_may_grow(false);
  ops();
  cudaGraph_t graph = nullptr;
  cudaError_t error = cudaStreamEndCapture(stream_, &graph);
  cudaGraphExec_t exec = nullptr;
  if (error == cudaSuccess) error = cudaGraphInstantiate(&exec, graph, 0);
  if (graph != nullptr) cudaGraphDestroy(graph);
  if (error != cudaSuccess) {
    cudaGetLastError();
    std::fprintf(stderr,
                 "tandem CUDA backend: recording a step failed (%s); steps run without CUDA "
                 "graphs from now on\n",
                 cudaGetErrorString(error));
    graphs_failed_ = true;
    return false;
  }
  recordings_[key] = {exec, scratch_generation_, uploads_.generation()};
  // The capture recorded the work without running it.
  CheckCuda(cudaGraphLaunch(exec, stream_), "cudaGraphLaunch");
  return true;
}

}  // namespace tandem::kernels::cuda
