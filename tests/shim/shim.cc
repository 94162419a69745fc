// The GoogleTest bridge: the only C++ in loom. Each LOOM_TEST registered by a C
// constructor becomes one gtest case; failures and skips recorded from C are forwarded.
#include <gtest/gtest.h>

#include <cstdarg>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <sys/stat.h>
#include <string>
#include <vector>

#include "tests/shim/loom_test.h"

namespace {

struct Entry {
    std::string suite, name, file;
    int line;
    loom_test_fn fn;
};

std::vector<Entry> &entries() {
    static std::vector<Entry> e;
    return e;
}

thread_local int g_failures = 0;
thread_local bool g_skipped = false;
thread_local std::string g_skip_reason;
thread_local uint64_t g_rng = 0;

class CTest : public testing::Test {
  public:
    explicit CTest(const Entry &e) : e_(e) {}
    void TestBody() override {
        g_failures = 0;
        g_skipped = false;
        uint64_t h = 1469598103934665603ull;
        for (char c : e_.suite + "." + e_.name) h = (h ^ (unsigned char)c) * 1099511628211ull;
        g_rng = h | 1;
        e_.fn();
        if (g_skipped) GTEST_SKIP() << g_skip_reason;
    }

  private:
    Entry e_;
};

} // namespace

extern "C" void loom_test_register(const char *suite, const char *name, loom_test_fn fn,
                                   const char *file, int line) {
    entries().push_back(Entry{suite, name, file, line, fn});
}

extern "C" bool loom_test_fail(const char *file, int line, const char *fmt, ...) {
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    g_failures++;
    ADD_FAILURE_AT(file, line) << buf;
    return false;
}

extern "C" void loom_test_skip(const char *file, int line, const char *reason) {
    (void)file;
    (void)line;
    g_skipped = true;
    g_skip_reason = reason ? reason : "";
}

extern "C" int loom_test_failures(void) { return g_failures; }

extern "C" uint32_t loom_test_rand(void) {
    // xorshift64*
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return (uint32_t)((g_rng * 2685821657736338717ull) >> 32);
}

extern "C" float loom_test_randf(float lo, float hi) {
    return lo + (hi - lo) * (float)(loom_test_rand() >> 8) / (float)(1u << 24);
}

extern "C" const char *loom_test_source_root(void) {
    static std::string root;
    static bool done = false;
    if (!done) {
        done = true;
        const char *srcdir = getenv("TEST_SRCDIR");
        const char *ws = getenv("TEST_WORKSPACE");
        std::string link = std::string(srcdir ? srcdir : ".") + "/" + (ws ? ws : "loom") + "/WORKSPACE";
        char buf[PATH_MAX];
        if (realpath(link.c_str(), buf)) {
            std::string p(buf);
            root = p.substr(0, p.rfind('/'));
        }
    }
    return root.empty() ? nullptr : root.c_str();
}

extern "C" const char *loom_test_models_dir(void) {
    static std::string dir;
    static bool done = false;
    if (!done) {
        done = true;
        const char *env = getenv("LOOM_MODELS_DIR");
        struct stat sb;
        if (env && *env && stat(env, &sb) == 0) {
            dir = env;
        } else if (const char *root = loom_test_source_root()) {
            std::string d = std::string(root) + "/../shared/models";
            if (stat(d.c_str(), &sb) == 0 && S_ISDIR(sb.st_mode)) dir = d;
        }
    }
    return dir.empty() ? nullptr : dir.c_str();
}

int main(int argc, char **argv) {
    testing::InitGoogleTest(&argc, argv);
    for (const Entry &e : entries()) {
        testing::RegisterTest(e.suite.c_str(), e.name.c_str(), nullptr, nullptr, e.file.c_str(),
                              e.line, [e]() -> testing::Test * { return new CTest(e); });
    }
    return RUN_ALL_TESTS();
}
