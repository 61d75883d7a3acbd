// Doctest's main plus a listener that reports skipped GPU cases by name and writes the
// one-line summary ("N passed, N failed, N skipped") that the top-level `make test` sums.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "attention.h"
#include "element.h"
#include "harness.h"
#include "stage_name.h"

namespace {

class SummaryListener : public doctest::IReporter {
public:
    explicit SummaryListener(const doctest::ContextOptions& options) : out_(*options.cout) {}

    // A case may give its own reason in its description (the ring's cases: how many GPUs they
    // need); the others share the stage's.
    void test_case_skipped(const doctest::TestCaseData& test) override {
        if (!test.m_skip) return;
        const bool own = test.m_description != nullptr && *test.m_description != '\0';
        skipped_.push_back({test.m_name, own ? test.m_description : gpu_unusable_reason(stage_capabilities())});
    }

    void test_run_end(const doctest::TestRunStats& stats) override {
        for (const auto& [name, reason] : skipped_)
            out_ << "skipped (" << reason << "): " << name << "\n";
        const int failed = int(stats.numTestCasesFailed);
        const int passed = int(stats.numTestCasesPassingFilters) - failed;
        const std::string line = std::to_string(passed) + " passed, " + std::to_string(failed) +
                                 " failed, " + std::to_string(skipped_.size()) + " skipped";
        out_ << "suite " << attention_stage_name() << ": " << line << "\n";
        if (const char* path = std::getenv("TEST_SUMMARY_FILE")) {
            std::ofstream file(path);
            file << attention_stage_name() << ": " << line << "\n";
        }
    }

    void report_query(const doctest::QueryData&) override {}
    void test_run_start() override {}
    void test_case_start(const doctest::TestCaseData&) override {}
    void test_case_reenter(const doctest::TestCaseData&) override {}
    void test_case_end(const doctest::CurrentTestCaseStats&) override {}
    void test_case_exception(const doctest::TestCaseException&) override {}
    void subcase_start(const doctest::SubcaseSignature&) override {}
    void subcase_end() override {}
    void log_assert(const doctest::AssertData&) override {}
    void log_message(const doctest::MessageData&) override {}

private:
    std::ostream& out_;
    std::vector<std::pair<std::string, std::string>> skipped_;  // name, reason
};

REGISTER_LISTENER("summary", 1, SummaryListener);

}  // namespace

int main(int argc, char** argv) {
    std::printf("== %s (%s): ", attention_stage_name(), kElementName);
    const std::string unusable = gpu_unusable_reason(stage_capabilities());
    if (unusable.empty()) {
        cudaDeviceProp properties{};
        CUDA_CHECK(cudaGetDeviceProperties(&properties, 0));
        std::printf("GPU cases run on %s\n", properties.name);
    } else {
        std::printf("%s: GPU cases are skipped\n", unusable.c_str());
    }
    std::fflush(stdout);
    doctest::Context context;
    context.applyCommandLine(argc, argv);
    return context.run();
}
