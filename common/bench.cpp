// The benchmark driver, built once per stage against that stage's launcher (common/stage.mk).
// A shape or a named sweep in; one CSV row per (shape, pass) out, with the columns of kCsvHeader.
//
// How it times (docs and chapters quote this, so it stays simple):
//   * CUDA events around every call, on a stream of its own;
//   * warm-up calls first, then an adaptive number of timed calls (about --target-seconds of
//     work, at least 3, at most 50; fewer only under --max-seconds-per-shape), median and min;
//   * the calls rotate over several independent sets of input and output buffers whose total
//     size exceeds four times the L2 cache, so that no call finds its inputs already in L2;
//   * inputs are random (randn + 0.5, never zeros: zeros draw less power and run faster).
// FLOPs follow the FlashAttention convention (harness.h): forward 4*B*H*Lq*Lk*D, halved when
// causal; backward 2.5x forward. "% of SOL" is against the measured GEMM ceiling of the stage's
// element type (ceilings.h): BF16 tensor-core GEMM for bf16 stages, FP32 GEMM for fp32 stages.
#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include <cuda_runtime.h>

#include "attention.h"
#include "ceilings.h"
#include "cuda_check.h"
#include "element.h"
#include "harness.h"
#include "stage_name.h"
#include "timing.h"
#include "validate.h"

#if defined(ATTENTION_HAS_BACKWARD) && !defined(ATTENTION_DTYPE_BF16)
#error "attention_backward is declared for bf16 only"
#endif

namespace {

const char* const kCsvHeader =
    "gpu,stage,dtype,batch,heads,len_q,len_kv,head_dim,causal,pass,median_ms,min_ms,tflops,"
    "pct_sol,workspace_bytes,commit,status";
const char* const kFlopConvention =
    "FLOPs follow the FlashAttention convention: forward 4*B*H*Lq*Lk*D (halved when causal), "
    "backward 2.5x forward; TFLOP/s = FLOPs / median time";

// Timing policy (see the top of the file).
constexpr double kDefaultTargetSeconds = 0.25;
constexpr int kL2Multiple = 4;            // rotated buffers exceed this many times the L2 size
// Left free for what the driver does not see: the CUDA context growing, cuBLAS's own
// workspace, allocator granularity.
constexpr size_t kMemoryReserveBytes = size_t(512) << 20;
// Each set's buffers start on this boundary, beyond any stage's vector-width alignment.
constexpr size_t kBufferAlignmentBytes = 256;

enum class Pass { forward, backward };
const char* pass_name(Pass pass) {
    return pass == Pass::forward ? "fwd" : "bwd";
}

struct Options {
    std::vector<std::string> sweeps;
    std::vector<AttentionShape> shapes;
    std::string pass;  // fwd | bwd | all; empty selects fwd, plus bwd when the stage has one
    std::string csv_path;
    std::string ceilings_path;
    std::string sweeps_path;
    std::string commit;
    bool measure_ceilings = false;
    bool profile = false;
    double max_seconds_per_shape = 0;  // 0: no cap
    double target_seconds = kDefaultTargetSeconds;
};

void print_usage(const char* program) {
    std::printf(
        "usage: %s [options]\n"
        "  --sweep NAME[,NAME...]      shapes of named sweeps (bench/sweeps.txt); repeatable\n"
        "  --shape B,H,Lq,Lk,D[,causal] one shape; repeatable\n"
        "  --pass fwd|bwd|all          default: fwd, plus bwd when the stage has a backward\n"
        "  --csv FILE                  append one row per (shape, pass); header if new\n"
        "  --ceilings-file FILE        measured ceilings for %% of SOL (default: measure now)\n"
        "  --ceilings                  measure the ceilings, write them to --ceilings-file or\n"
        "                              stdout, and benchmark nothing\n"
        "  --sweeps-file FILE          default: bench/sweeps.txt beside the build folder\n"
        "  --profile                   run each shape twice without timing (for Nsight Compute)\n"
        "  --commit SHA                written to the CSV (default: git rev-parse of the tree)\n"
        "  --target-seconds X          timed work per shape (default %.2f)\n"
        "  --max-seconds-per-shape X   cap on timed work per shape; a call slower than X/3\n"
        "                              then gets fewer than 3 timed repeats (at least 1)\n"
        "With neither --sweep nor --shape: the headline sweep of the stage's element type.\n",
        program, kDefaultTargetSeconds);
}

int parse_int(const std::string& text, const std::string& what) {
    size_t used = 0;
    long value = 0;
    try {
        value = std::stol(text, &used);
    } catch (const std::exception&) {
        used = 0;
    }
    if (used != text.size() || used == 0 || value < INT_MIN || value > INT_MAX)
        throw std::invalid_argument(what + ": '" + text + "' is not an integer");
    return int(value);
}

double parse_double(const std::string& text, const std::string& what) {
    size_t used = 0;
    double value = 0;
    try {
        value = std::stod(text, &used);
    } catch (const std::exception&) {
        used = 0;
    }
    if (used != text.size() || used == 0 || !(value >= 0))
        throw std::invalid_argument(what + ": '" + text + "' is not a non-negative number");
    return value;
}

std::vector<std::string> split(const std::string& text, char separator) {
    std::vector<std::string> parts;
    std::stringstream stream(text);
    std::string part;
    while (std::getline(stream, part, separator)) parts.push_back(part);
    return parts;
}

AttentionShape parse_shape(const std::string& text) {
    const std::vector<std::string> fields = split(text, ',');
    if (fields.size() != 5 && fields.size() != 6)
        throw std::invalid_argument("--shape expects B,H,Lq,Lk,D[,causal], got '" + text + "'");
    int value[6] = {0, 0, 0, 0, 0, 0};
    for (size_t i = 0; i < fields.size(); ++i) value[i] = parse_int(fields[i], "--shape");
    return make_shape(value[0], value[1], value[2], value[3], value[4], value[5] != 0);
}

Options parse_arguments(int argc, char** argv) {
    Options options;
    for (int i = 1; i < argc; ++i) {
        const std::string flag = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
            return argv[++i];
        };
        if (flag == "--sweep") {
            for (const std::string& name : split(value(), ','))
                if (!name.empty()) options.sweeps.push_back(name);
        } else if (flag == "--shape") {
            options.shapes.push_back(parse_shape(value()));
        } else if (flag == "--pass") {
            options.pass = value();
            if (options.pass != "fwd" && options.pass != "bwd" && options.pass != "all")
                throw std::invalid_argument("--pass takes fwd, bwd or all, got '" + options.pass +
                                            "'");
        } else if (flag == "--csv") {
            options.csv_path = value();
        } else if (flag == "--ceilings-file") {
            options.ceilings_path = value();
        } else if (flag == "--ceilings") {
            options.measure_ceilings = true;
        } else if (flag == "--sweeps-file") {
            options.sweeps_path = value();
        } else if (flag == "--profile") {
            options.profile = true;
        } else if (flag == "--commit") {
            options.commit = value();
        } else if (flag == "--target-seconds") {
            options.target_seconds = parse_double(value(), flag);
        } else if (flag == "--max-seconds-per-shape") {
            options.max_seconds_per_shape = parse_double(value(), flag);
        } else if (flag == "--help" || flag == "-h") {
            print_usage(argv[0]);
            std::exit(0);
        } else {
            throw std::invalid_argument("unknown option '" + flag + "'");
        }
    }
    return options;
}

std::string executable_directory() {
    char path[4096];
    const ssize_t length = readlink("/proc/self/exe", path, sizeof(path) - 1);
    if (length <= 0) return ".";
    path[length] = '\0';
    std::string full(path);
    return full.substr(0, full.find_last_of('/'));
}

// The binary lives in build/<stage>/, two folders below the repository root.
std::string find_sweeps_file(const Options& options) {
    if (!options.sweeps_path.empty()) return options.sweeps_path;
    const std::vector<std::string> candidates = {executable_directory() + "/../../bench/sweeps.txt",
                                                 "bench/sweeps.txt", "../bench/sweeps.txt"};
    for (const std::string& candidate : candidates)
        if (std::ifstream(candidate)) return candidate;
    throw std::runtime_error(
        "bench/sweeps.txt not found next to the build folder or here; "
        "pass --sweeps-file");
}

// Lines "name batch heads len_q len_kv head_dim causal"; '#' starts a comment.
std::map<std::string, std::vector<AttentionShape>> read_sweeps(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot read " + path);
    std::map<std::string, std::vector<AttentionShape>> sweeps;
    std::string line;
    for (int line_number = 1; std::getline(in, line); ++line_number) {
        line = line.substr(0, line.find('#'));
        std::istringstream fields(line);
        std::string name;
        if (!(fields >> name)) continue;
        int batch, heads, len_q, len_kv, head_dim, causal;
        std::string extra;
        if (!(fields >> batch >> heads >> len_q >> len_kv >> head_dim >> causal) ||
            (fields >> extra))
            throw std::runtime_error(path + ":" + std::to_string(line_number) +
                                     ": expected 'name batch heads len_q len_kv head_dim causal'");
        sweeps[name].push_back(make_shape(batch, heads, len_q, len_kv, head_dim, causal != 0));
    }
    return sweeps;
}

bool same_shape(const AttentionShape& a, const AttentionShape& b) {
    return a.batch == b.batch && a.heads == b.heads && a.len_q == b.len_q && a.len_kv == b.len_kv &&
           a.head_dim == b.head_dim && a.causal == b.causal && a.scale == b.scale;
}

std::vector<AttentionShape> collect_shapes(const Options& options, const StageCapabilities& caps) {
    std::vector<std::string> sweep_names = options.sweeps;
    if (sweep_names.empty() && options.shapes.empty())
        sweep_names.push_back(caps.dtype == "bf16" ? "bf16-headline" : "fp32-headline");
    std::vector<AttentionShape> shapes = options.shapes;
    if (!sweep_names.empty()) {
        const std::string path = find_sweeps_file(options);
        const auto sweeps = read_sweeps(path);
        for (const std::string& name : sweep_names) {
            const auto found = sweeps.find(name);
            if (found == sweeps.end()) {
                std::string known;
                for (const auto& entry : sweeps) known += " " + entry.first;
                throw std::invalid_argument("no sweep '" + name + "' in " + path +
                                            "; known:" + known);
            }
            shapes.insert(shapes.end(), found->second.begin(), found->second.end());
        }
    }
    // A shape listed by two sweeps is measured once.
    std::vector<AttentionShape> unique;
    for (const AttentionShape& shape : shapes) {
        bool seen = false;
        for (const AttentionShape& kept : unique) seen = seen || same_shape(kept, shape);
        if (!seen) unique.push_back(shape);
    }
    return unique;
}

std::string git_commit() {
    const std::string command =
        "git -C '" + executable_directory() + "' rev-parse --short HEAD 2>/dev/null";
    FILE* pipe = popen(command.c_str(), "r");
    if (!pipe) return "unknown";
    char buffer[128] = {0};
    std::string commit = std::fgets(buffer, sizeof(buffer), pipe) ? buffer : "";
    pclose(pipe);
    while (!commit.empty() && std::isspace((unsigned char)commit.back())) commit.pop_back();
    return commit.empty() ? "unknown" : commit;
}

std::string format(const char* pattern, double value) {
    char buffer[64];
    std::snprintf(buffer, sizeof(buffer), pattern, value);
    return buffer;
}

std::string gib(double bytes) {
    return format("%.2f GiB", bytes / double(size_t(1) << 30));
}

// ---- device buffers ---------------------------------------------------------------------

size_t aligned_elements(size_t count, size_t element_bytes) {
    const size_t per_boundary = kBufferAlignmentBytes / element_bytes;
    return (count + per_boundary - 1) / per_boundary * per_boundary;
}

// `count` independent sets of every buffer a pass touches: one allocation per tensor, holding
// `count` equal slices that each start on a kBufferAlignmentBytes boundary.
struct BufferSets {
    int count = 0;
    DeviceBuffer<Element> q, k, v, o, dout, dq, dk, dv;
    DeviceBuffer<float> lse;

    static size_t q_slice(const AttentionShape& shape) {
        return aligned_elements(shape.q_elements(), sizeof(Element));
    }
    static size_t kv_slice(const AttentionShape& shape) {
        return aligned_elements(shape.kv_elements(), sizeof(Element));
    }
    static size_t lse_slice(const AttentionShape& shape) {
        return aligned_elements(shape.lse_elements(), sizeof(float));
    }
    static size_t bytes_per_set(const AttentionShape& shape, Pass pass) {
        // Forward: q, o and k, v. Backward adds dout, dq and dk, dv.
        const size_t tensors = pass == Pass::forward ? 2 : 4;
        return tensors * (q_slice(shape) + kv_slice(shape)) * sizeof(Element) +
               lse_slice(shape) * sizeof(float);
    }

    BufferSets(const AttentionShape& shape, Pass pass, int sets, cudaStream_t stream)
        : count(sets),
          q(q_slice(shape) * sets),
          k(kv_slice(shape) * sets),
          v(kv_slice(shape) * sets),
          o(q_slice(shape) * sets),
          lse(lse_slice(shape) * sets) {
        // Different starting offsets into the pool, so that q, k and v differ.
        fill_random(q.data(), q.count(), 0, stream);
        fill_random(k.data(), k.count(), kRandomPoolElements / 5, stream);
        fill_random(v.data(), v.count(), 2 * kRandomPoolElements / 5, stream);
        if (pass == Pass::backward) {
            dout = DeviceBuffer<Element>(q_slice(shape) * sets);
            dq = DeviceBuffer<Element>(q_slice(shape) * sets);
            dk = DeviceBuffer<Element>(kv_slice(shape) * sets);
            dv = DeviceBuffer<Element>(kv_slice(shape) * sets);
            fill_random(dout.data(), dout.count(), 3 * kRandomPoolElements / 5, stream);
        }
        CUDA_CHECK(cudaStreamSynchronize(stream));
    }

    // Set `set`'s slice of one of the buffers above.
    template <class T>
    T* at(const DeviceBuffer<T>& buffer, int set) const {
        return buffer.data() + size_t(set) * (buffer.count() / size_t(count));
    }
};

// ---- timing -----------------------------------------------------------------------------


// ---- one (shape, pass) ----------------------------------------------------------------------

struct Row {
    AttentionShape shape;
    Pass pass = Pass::forward;
    bool ok = false;
    std::string skip_reason;
    Timing timing;
    double tflops = 0;
    double pct_sol = -1;             // negative: no ceiling known
    long long workspace_bytes = -1;  // negative: not known
    int sets = 0;
};

std::string unsupported_reason(const AttentionShape& shape, Pass pass,
                               const StageCapabilities& caps) {
    if (caps.compute_capability != 0) {
        const std::string unusable = gpu_unusable_reason(caps);
        if (!unusable.empty()) return unusable;
    }
    // The same refusal the launcher would give, in its words.
    try {
        validate_shape(shape, caps);
    } catch (const std::invalid_argument& error) {
        return error.what();
    }
    if (pass == Pass::backward) {
        if (!caps.backward) return "the stage has no backward pass";
#if !defined(ATTENTION_HAS_BACKWARD)
        return "built without ATTENTION_HAS_BACKWARD";
#endif
    }
    return "";
}

size_t workspace_bytes(const AttentionShape& shape, Pass pass) {
    const size_t forward = attention_workspace_bytes(shape);
#if defined(ATTENTION_HAS_BACKWARD)
    // The backward's inputs o and lse come from a forward on the same buffers first.
    if (pass == Pass::backward) return std::max(forward, attention_backward_workspace_bytes(shape));
#endif
    (void)pass;
    return forward;
}

void forward_on(const BufferSets& b, int set, const AttentionShape& shape, cudaStream_t stream) {
    attention_forward(b.at(b.q, set), b.at(b.k, set), b.at(b.v, set), b.at(b.o, set),
                      b.at(b.lse, set), shape, stream);
}

void backward_on(const BufferSets& b, int set, const AttentionShape& shape, cudaStream_t stream) {
#if defined(ATTENTION_HAS_BACKWARD)
    attention_backward(b.at(b.q, set), b.at(b.k, set), b.at(b.v, set), b.at(b.o, set),
                       b.at(b.lse, set), b.at(b.dout, set), b.at(b.dq, set), b.at(b.dk, set),
                       b.at(b.dv, set), shape, stream);
#else
    (void)b, (void)set, (void)shape, (void)stream;
    throw std::logic_error("backward called in a build without ATTENTION_HAS_BACKWARD");
#endif
}

// Allocates the buffer sets, or returns null with `reason` set when the device is out of memory
// (cudaMalloc's out-of-memory error leaves the context usable, unlike a kernel fault).
std::unique_ptr<BufferSets> allocate(const AttentionShape& shape, Pass pass, int sets,
                                     cudaStream_t stream, std::string& reason) {
    try {
        return std::make_unique<BufferSets>(shape, pass, sets, stream);
    } catch (const std::runtime_error& error) {
        const cudaError_t last = cudaGetLastError();
        if (last != cudaErrorMemoryAllocation || cudaDeviceSynchronize() != cudaSuccess) throw;
        reason = std::string("device memory allocation failed: ") + error.what();
        return nullptr;
    }
}

Row run_one(const AttentionShape& shape, Pass pass, const StageCapabilities& caps,
            const cudaDeviceProp& device, double gemm_ceiling_tflops, cudaStream_t stream,
            const Options& options) {
    Row row;
    row.shape = shape;
    row.pass = pass;
    row.skip_reason = unsupported_reason(shape, pass, caps);
    if (!row.skip_reason.empty()) return row;

    size_t workspace = 0;
    try {
        workspace = workspace_bytes(shape, pass);
    } catch (const std::invalid_argument& error) {
        row.skip_reason = error.what();
        return row;
    }
    row.workspace_bytes = (long long)workspace;

    size_t free_bytes = 0, total_bytes = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    const size_t set_bytes = BufferSets::bytes_per_set(shape, pass);
    const double usable = double(free_bytes) - double(kMemoryReserveBytes) - double(workspace);
    if (usable < double(set_bytes)) {
        row.skip_reason = "not enough device memory: needs " + gib(double(set_bytes)) +
                          " of buffers + " + gib(double(workspace)) + " of workspace, " +
                          gib(double(free_bytes)) + " free";
        return row;
    }
    const size_t l2_target = size_t(kL2Multiple) * size_t(device.l2CacheSize);
    const size_t wanted = std::max<size_t>(1, (l2_target + set_bytes - 1) / set_bytes);
    const size_t fitting = size_t(usable / double(set_bytes));
    row.sets = int(std::min({wanted, fitting, size_t(INT_MAX)}));
    if (options.profile) row.sets = 1;

    std::unique_ptr<BufferSets> buffers = allocate(shape, pass, row.sets, stream, row.skip_reason);
    if (!buffers) return row;

    try {
        if (pass == Pass::backward)
            for (int set = 0; set < row.sets; ++set) forward_on(*buffers, set, shape, stream);
        auto call = [&](int set) {
            if (pass == Pass::forward)
                forward_on(*buffers, set, shape, stream);
            else
                backward_on(*buffers, set, shape, stream);
        };
        if (options.profile) {
            // Two plain calls: the first pays one-time costs (module loading), the second is
            // the one worth reading in the profiler.
            call(0);
            call(0);
            CUDA_CHECK(cudaStreamSynchronize(stream));
            row.ok = true;
            return row;
        }
        row.timing = time_calls(call, row.sets, stream, options.target_seconds,
                                options.max_seconds_per_shape);
    } catch (const std::invalid_argument& refused) {
        row.skip_reason = refused.what();
        return row;
    }
    row.ok = true;
    const double flops = pass == Pass::forward ? forward_flops(shape) : backward_flops(shape);
    row.tflops = flops / (row.timing.median_ms * 1e-3) / 1e12;
    if (gemm_ceiling_tflops > 0) row.pct_sol = 100.0 * row.tflops / gemm_ceiling_tflops;
    return row;
}

// ---- output -------------------------------------------------------------------------------

std::string csv_row(const Row& row, const StageCapabilities& caps, const std::string& gpu,
                    const std::string& commit) {
    const AttentionShape& s = row.shape;
    std::ostringstream out;
    out << csv_field(gpu) << "," << csv_field(caps.name) << "," << caps.dtype << "," << s.batch
        << "," << s.heads << "," << s.len_q << "," << s.len_kv << "," << s.head_dim << ","
        << int(s.causal) << "," << pass_name(row.pass) << ",";
    if (row.ok) {
        out << format("%.6g", row.timing.median_ms) << "," << format("%.6g", row.timing.min_ms)
            << "," << format("%.5g", row.tflops) << ","
            << (row.pct_sol >= 0 ? format("%.4g", row.pct_sol) : "") << ",";
    } else {
        out << ",,,,";
    }
    out << (row.workspace_bytes >= 0 ? std::to_string(row.workspace_bytes) : "") << ","
        << csv_field(commit) << "," << csv_field(row.ok ? "ok" : "skipped: " + row.skip_reason);
    return out.str();
}

std::string progress_line(const Row& row, int index, int total, const Options& options) {
    std::ostringstream line;
    line << "[" << attention_stage_name() << "] " << index << "/" << total << " "
         << pass_name(row.pass) << " " << row.shape.to_string() << ": ";
    if (!row.ok) {
        line << "skipped: " << row.skip_reason;
    } else if (options.profile) {
        line << "ran twice (profile mode, not timed)";
    } else {
        line << format("%.4g", row.timing.median_ms) << " ms, " << format("%.1f", row.tflops)
             << " TFLOP/s";
        if (row.pct_sol >= 0) line << ", " << format("%.1f", row.pct_sol) << "% of SOL";
        line << " (median of " << row.timing.calls << ", min " << format("%.4g", row.timing.min_ms)
             << " ms, " << row.sets << " input set" << (row.sets > 1 ? "s" : "") << ")";
    }
    return line.str();
}

// Appends to `path`, writing the header first when the file is new or empty; refuses a file
// whose header differs, so that runs of different formats never mix.
std::ofstream open_results_csv(const std::string& path) {
    std::string first_line;
    {
        std::ifstream existing(path);
        if (existing) std::getline(existing, first_line);
    }
    if (!first_line.empty() && first_line != kCsvHeader)
        throw std::runtime_error(path + " has a different header; expected: " + kCsvHeader);
    std::ofstream out(path, std::ios::app);
    if (!out) throw std::runtime_error("cannot write " + path);
    if (first_line.empty()) out << kCsvHeader << "\n";
    return out;
}

void print_ceilings(const Ceilings& ceilings, const std::string& source, FILE* out = stdout) {
    std::fprintf(out, "[%s] ceilings (%s):", attention_stage_name(), source.c_str());
    for (const Ceiling& entry : ceilings.entries)
        std::fprintf(out, " %s %.1f %s;", entry.name.c_str(), entry.value, entry.unit.c_str());
    std::fprintf(out, "\n");
}

int run(const Options& options) {
    int device_index = 0;
    CUDA_CHECK(cudaGetDevice(&device_index));
    cudaDeviceProp device{};
    CUDA_CHECK(cudaGetDeviceProperties(&device, device_index));
    const std::string gpu = device.name;

    if (options.measure_ceilings) {
        const Ceilings ceilings = measure_ceilings();
        // With no file the CSV goes to stdout, so the summary goes to stderr.
        print_ceilings(ceilings, "measured on " + gpu,
                       options.ceilings_path.empty() ? stderr : stdout);
        if (options.ceilings_path.empty()) {
            write_ceilings_csv(std::cout, ceilings);
        } else {
            std::ofstream out(options.ceilings_path);
            write_ceilings_csv(out, ceilings);
            if (!out) throw std::runtime_error("cannot write " + options.ceilings_path);
        }
        return 0;
    }

    const StageCapabilities& caps = stage_capabilities();
    const std::vector<AttentionShape> shapes = collect_shapes(options, caps);
    std::vector<Pass> passes;
    const bool has_backward = caps.backward;
    if (options.pass == "fwd" || options.pass.empty() || options.pass == "all")
        passes.push_back(Pass::forward);
    if (options.pass == "bwd" || options.pass == "all" || (options.pass.empty() && has_backward))
        passes.push_back(Pass::backward);

    std::printf("[%s] %s (%s) on %s, %zu shape(s) x %zu pass(es)\n", attention_stage_name(),
                caps.name.c_str(), caps.dtype.c_str(), gpu.c_str(), shapes.size(), passes.size());
    std::printf("[%s] %s\n", attention_stage_name(), kFlopConvention);

    double gemm_ceiling = 0;
    if (!options.profile) {
        Ceilings ceilings;
        if (!options.ceilings_path.empty()) {
            ceilings = read_ceilings_csv(options.ceilings_path);
            print_ceilings(ceilings, "from " + options.ceilings_path);
        } else {
            ceilings = measure_ceilings();
            print_ceilings(ceilings, "measured now");
        }
        if (ceilings.gpu == gpu) {
            gemm_ceiling = ceilings.gemm_tflops_for(caps.dtype);
            std::printf("[%s] %% of SOL is against the %s GEMM ceiling, %.1f TFLOP/s\n",
                        attention_stage_name(), caps.dtype.c_str(), gemm_ceiling);
        } else {
            std::printf("[%s] the ceilings were measured on %s, not this %s: no %% of SOL\n",
                        attention_stage_name(), ceilings.gpu.c_str(), gpu.c_str());
        }
    }

    std::ofstream csv;
    if (!options.csv_path.empty() && !options.profile) csv = open_results_csv(options.csv_path);
    const std::string commit = options.commit.empty() ? git_commit() : options.commit;

    cudaStream_t stream = nullptr;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const int total = int(shapes.size() * passes.size());
    int index = 0;
    for (const AttentionShape& shape : shapes) {
        for (Pass pass : passes) {
            const Row row = run_one(shape, pass, caps, device, gemm_ceiling, stream, options);
            std::printf("%s\n", progress_line(row, ++index, total, options).c_str());
            std::fflush(stdout);
            if (csv.is_open()) {
                csv << csv_row(row, caps, gpu, commit) << "\n";
                csv.flush();
            }
        }
    }
    CUDA_CHECK(cudaStreamDestroy(stream));
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    Options options;
    try {
        options = parse_arguments(argc, argv);
    } catch (const std::invalid_argument& error) {
        std::fprintf(stderr, "error: %s\n", error.what());
        print_usage(argv[0]);
        return 2;
    }
    try {
        return run(options);
    } catch (const std::exception& error) {
        std::fflush(stdout);
        std::fprintf(stderr, "[%s] error: %s\n", attention_stage_name(), error.what());
        return 1;
    }
}
