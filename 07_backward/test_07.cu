// The case only stage 07 has: its backward refuses a grid it cannot launch before it
// allocates anything. (That its forward is stage 06's is checked by make docs-check.)
#include <cstdint>
#include <stdexcept>
#include <string>

#include "test_support.h"

TEST_CASE("07: a backward grid past its limit is refused before anything is allocated") {
    // batch * heads = 2^30 fits the forward; times 3 key tiles of 128 it passes 2^31 - 1.
    const AttentionShape shape = make_shape(1 << 20, 1 << 10, 1, 300, 64);
    // Addresses that are never touched: the refusal comes before the pointers are examined.
    auto* fake = reinterpret_cast<__nv_bfloat16*>(uintptr_t(1) << 40);
    auto* fake_lse = reinterpret_cast<float*>(uintptr_t(1) << 41);
    try {
        attention_backward(fake, fake, fake, fake, fake_lse, fake, fake, fake, fake, shape);
        FAIL("not refused");
    } catch (const std::invalid_argument& error) {
        const std::string message = error.what();
        INFO(message);
        CHECK(message.find("ceil(len_kv / 128) = 3221225472") != std::string::npos);
    }
}
