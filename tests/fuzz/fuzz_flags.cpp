// A seeded random fuzz driver over Megatron command lines: from_megatron_flags -> validate ->
// describe -> emit_cpp, and the argument-file splitter. Built with AddressSanitizer and
// UndefinedBehaviorSanitizer (a report aborts the run). An input may be rejected only with
// flag_error (argparse's exit 2); any other exception, a crash, a sanitizer report or an input
// that takes over a second fails.
//
//   fuzz_flags [--seed S] [--inputs N]
//
// The inputs mix real flags of the generated table with junk: values of every type, each
// flag's choices, module names, layer-frequency expressions (well- and ill-formed), '=' forms,
// negative numbers, Python-style ints, non-finite and extreme reals, empty and long strings; one in
// fifty names a tree of argument files (fan-out, depth, large and sparse files, a FIFO, a device,
// a directory, a missing file). Each input also checks that a random finite double's fraction{...}
// spelling (--emit-cpp's) gives back its bits.

#include <capscope/capscope.hpp>
#include <capscope/emit_cpp.hpp>
#include <capscope/flags/argument_file.hpp>
#include <capscope/flags/from_megatron_flags.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace {

using capscope::flags::megatron_flag_table;

struct generator {
    std::mt19937_64 rng;
    std::size_t pick(std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng); }
    bool chance(int percent) { return int(pick(100)) < percent; }

    std::string number() {
        static const char* pool[] = {"0", "1", "-1", "3", "16", "-5", "2147483647", "2147483648", "-2147483649", "99999999999999999999",
                                     "1.5", "-.5", "1e-3", "1e400", "nan", "inf", "-inf", "1_000", "1__0", " 7 ", "+8", "0x10", "", ".",
                                     "1_000_000", "_1", "1_", "0b11", "1e-30", "5e-324", "-0.0", "NaN", "Infinity", "1.7976931348623157e308",
                                     "9223372036854775808", "-nan", "1e-320"};
        return pool[pick(std::size(pool))];
    }
    std::string expression() {
        static const char* pool[] = {"1", "4", "([0]*3+[1]*9)", "[1,0,1,0]", "[1]*24", "([0]+[1]*23)", "[[1]]", "[1,2]", "(", "[",
                                     "[1]*", "*3", "[1]+2", "[1]*-1", "[1]*99999999999", "()", "[]", "__import__('os')"};
        std::string s = pool[pick(std::size(pool))];
        if (chance(20)) s.insert(pick(s.size() + 1), 1, "[]()*+,0123456789 "[pick(18)]);
        return s;
    }
    std::string word() {
        static const char* pool[] = {"attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba", "full", "full_iteration",
                                     "full_iteration_inference", "core_attn", "layernorm", "qkv_linear", "attn_norm", "mlp_norm",
                                     "none", "local", "transformer_engine", "selective", "block", "layer", "alltoall", "x", "",
                                     "${DATA_PATH}", "a b", "\xff\xfe", "--", "-", "=", "@", "@missing_file"};
        std::string s = pool[pick(std::size(pool))];
        if (chance(3)) s = std::string(pick(300), 'a' + char(pick(26)));
        return s;
    }
    std::string value_for(const capscope::flags::flag_spec& f) {
        if (!f.choices.empty() && chance(60)) {
            std::vector<std::string_view> c;
            std::string_view rest = f.choices;
            for (std::size_t bar; (bar = rest.find('|')) != std::string_view::npos; rest.remove_prefix(bar + 1)) c.push_back(rest.substr(0, bar));
            c.push_back(rest);
            return std::string(c[pick(c.size())]);
        }
        switch (f.type) {
        case capscope::flags::value_type::integer:
            if (chance(70)) return std::to_string(int(pick(40)) - 4);
            return chance(80) ? number() : word();
        case capscope::flags::value_type::real:
            if (chance(70)) return std::to_string(double(pick(200)) / 100.0);
            return chance(80) ? number() : word();
        case capscope::flags::value_type::layer_frequency: return expression();
        default: return chance(70) ? word() : number();
        }
    }
    std::string_view rule_flag() {
        static const std::vector<std::string> flags = [] {
            std::vector<std::string> v;
            for (const auto& [name, handler] : capscope::flags::detail::rule_flags())
                if (capscope::flags::detail::find_flag(name)) v.push_back(name);
            return v;
        }();
        return flags[pick(flags.size())];
    }
    std::vector<std::string> command_line() {
        std::vector<std::string> args;
        const std::size_t n = pick(7);
        for (std::size_t i = 0; i < n; ++i) {
            if (chance(4)) { // junk that looks like an option, or a stray value
                static const char* junk[] = {"--", "-", "--cuda-graph", "--cuda-graph-impl=", "--num-layers=", "-h", "--no-such-flag",
                                             "-5", "positional", "--use-fully-shard-api", "--nccl-ub"};
                args.push_back(junk[pick(std::size(junk))]);
                continue;
            }
            // Half the time a flag the rules read, so validation and emission get real work.
            const auto& f = chance(50) ? *capscope::flags::detail::find_flag(rule_flag()) : megatron_flag_table[pick(std::size(megatron_flag_table))];
            const std::size_t values = chance(80) ? std::size_t(f.count) : pick(4);
            if (chance(15)) {
                args.push_back(std::string(f.flag) + "=" + value_for(f));
                continue;
            }
            args.push_back(std::string(f.flag));
            for (std::size_t k = 0; k < values; ++k) args.push_back(value_for(f));
        }
        return args;
    }
    std::string text() {
        std::string t;
        const std::size_t n = pick(120);
        static const char alphabet[] = "-- ab\t\n'\"\\#@x=1";
        for (std::size_t i = 0; i < n; ++i) t += alphabet[pick(sizeof alphabet - 1)];
        return t;
    }
};

//! A tree of argument files under `dir` for the command line to name: fan-out (a file naming the
//! next several times), depth, large files (sparse, past the size limit or just under it, named
//! many times), and paths that are no regular file (a FIFO, a device, a directory, a missing file).
//! Returns the `@FILE` argument to put on the command line.
std::string argument_files(generator& g, const std::filesystem::path& dir, long n) {
    namespace fs = std::filesystem;
    const fs::path root = dir / std::to_string(n);
    fs::create_directories(root);
    auto write = [](const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; };
    switch (g.pick(6)) {
    case 0: { // fan-out, 2-4 names per file, up to 20 deep
        const std::size_t depth = 1 + g.pick(20), fan = 2 + g.pick(3);
        for (std::size_t i = 0; i < depth; ++i) {
            std::string t;
            for (std::size_t k = 0; k < fan; ++k) t += "@" + (root / std::to_string(i + 1)).string() + " ";
            write(root / std::to_string(i), t);
        }
        write(root / std::to_string(depth), "--num-layers 4\n");
        return "@" + (root / "0").string();
    }
    case 1: { // a large file: sparse past the size limit, or 1 MiB of flags named up to 40 times
        const fs::path big = root / "big";
        if (g.chance(50)) {
            { std::ofstream(big) << "--num-layers 4 "; }
            fs::resize_file(big, capscope::flags::detail::max_input_file_bytes + 1);
        } else {
            std::string flags;
            while (flags.size() < (std::size_t(1) << 20)) flags += "--num-layers 4\n";
            write(big, flags);
        }
        std::string t;
        for (std::size_t k = 0, times = 1 + g.pick(40); k < times; ++k) t += "@" + big.string() + " ";
        write(root / "names_big", t);
        return "@" + (root / "names_big").string();
    }
    case 2: {
        const fs::path fifo = root / "fifo";
        ::mkfifo(fifo.c_str(), 0600);
        return "@" + fifo.string();
    }
    case 3: return g.chance(50) ? "@/dev/zero" : "@/dev/null";
    case 4: return "@" + root.string(); // a directory
    default: return "@" + (root / "missing").string();
    }
}

//! What `cpp_real` writes for `v`, evaluated as `real_value` evaluates a fraction: the same bits.
bool spelled_exactly(double v) {
    const std::string t = capscope::detail::cpp_real(v);
    long long n = 0, d = 1;
    int e = 0;
    if (std::sscanf(t.c_str(), "fraction{%lld, %lld, %d}", &n, &d, &e) < 2) return false;
    double x = double(n) / double(d);
    for (; e > 0; --e) x *= 2;
    for (; e < 0; ++e) x /= 2;
    return std::memcmp(&x, &v, sizeof v) == 0 || (x == 0 && v == 0 && std::signbit(x) == std::signbit(v));
}

[[noreturn]] void fail(const std::vector<std::string>& args, const std::string& why) {
    std::fprintf(stderr, "fuzz_flags: %s\n  input:", why.c_str());
    for (std::size_t i = 0; i < args.size() && i < 40; ++i) std::fprintf(stderr, " '%.200s'", args[i].c_str());
    if (args.size() > 40) std::fprintf(stderr, " ... (%zu arguments)", args.size());
    std::fprintf(stderr, "\n");
    std::exit(1);
}

} // namespace

int main(int argc, char** argv) {
    std::uint64_t seed = 1;
    long inputs = 10000;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i];
        if (a == "--seed") seed = std::strtoull(argv[i + 1], nullptr, 10);
        else if (a == "--inputs") inputs = std::strtol(argv[i + 1], nullptr, 10);
        else {
            std::fprintf(stderr, "usage: fuzz_flags [--seed S] [--inputs N]\n");
            return 2;
        }
    }
    generator g{std::mt19937_64(seed)};
    long rejected = 0, valid = 0, invalid = 0, file_trees = 0;
    const std::filesystem::path files = std::filesystem::temp_directory_path() / ("capscope_fuzz_" + std::to_string(::getpid()));
    struct remove_at_exit {
        std::filesystem::path p;
        ~remove_at_exit() { std::filesystem::remove_all(p); }
    } cleanup{files};
    const auto start = std::chrono::steady_clock::now();
    for (long n = 0; n < inputs; ++n) {
        const auto t0 = std::chrono::steady_clock::now();
        std::vector<std::string> args = g.command_line();
        const bool tree = g.chance(2);
        if (tree) {
            args.insert(args.begin() + std::ptrdiff_t(g.pick(args.size() + 1)), argument_files(g, files, n));
            ++file_trees;
        }
        // Every finite double has a fraction{...} spelling that gives back its bits (clang++ 14
        // takes no double template argument): random bit patterns, subnormals and extremes included.
        double real;
        const std::uint64_t bits = g.rng();
        std::memcpy(&real, &bits, sizeof real);
        if (std::isfinite(real) && !spelled_exactly(real)) fail({capscope::detail::cpp_real(real)}, "a finite real spelled inexactly");
        try {
            if (tree) args = capscope::flags::expand_argument_files(args);
            const auto line = capscope::flags::from_megatron_flags(args, {.ignore_unknown = g.chance(10)});
            const auto report = capscope::validate(line.config);
            (void)capscope::describe(report.normalized);
            const auto& emitted = report.later_stages_skipped ? line.config : report.normalized;
            (void)capscope::emit_cpp_translation_unit(emitted, {"fuzz"});
            (report.valid() ? valid : invalid) += 1;
        } catch (const capscope::flags::flag_error&) {
            ++rejected;
        } catch (const std::exception& e) {
            fail(args, std::string("unexpected exception: ") + e.what());
        }
        const std::string text = g.text();
        try {
            (void)capscope::flags::detail::shell_words(text, [](int line) { return "fuzz:" + std::to_string(line); });
        } catch (const capscope::flags::flag_error&) {
        } catch (const std::exception& e) {
            fail({text}, std::string("argument-file splitter: unexpected exception: ") + e.what());
        }
        if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(1)) fail(args, "an input took over a second");
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("fuzz_flags: seed %llu, %ld inputs in %.1f s (%ld naming argument-file trees): %ld valid, %ld invalid (rule violations), "
                "%ld rejected (flag_error); every finite real spelled exactly; no crash, hang or sanitizer report\n",
                (unsigned long long)seed, inputs, seconds, file_trees, valid, invalid, rejected);
    std::printf("%ld passed, 0 failed\n", inputs);
    return 0;
}
