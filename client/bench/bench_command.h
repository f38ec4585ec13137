// `tandem bench`: load over real gRPC (and, side by side, over llama-server's
// HTTP API) in the token shapes of a product, reported as latency
// percentiles, throughput and goodput. See docs/benchmarking.md.
#ifndef TANDEM_CLIENT_BENCH_BENCH_COMMAND_H_
#define TANDEM_CLIENT_BENCH_BENCH_COMMAND_H_

#include <string>

namespace tandem::bench {

// Runs the command from its flags. `servers` and `metrics` are the CLI's
// --server and --metrics (comma-separated lists here); `command_line` is
// recorded in the report. Returns the process exit code.
int RunBenchCommand(const std::string& servers, const std::string& metrics,
                    const std::string& command_line);

}  // namespace tandem::bench

#endif  // TANDEM_CLIENT_BENCH_BENCH_COMMAND_H_
