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
// negative numbers, empty and long strings.

#include <capscope/capscope.hpp>
#include <capscope/emit_cpp.hpp>
#include <capscope/flags/argument_file.hpp>
#include <capscope/flags/from_megatron_flags.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
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
                                     "1.5", "-.5", "1e-3", "1e400", "nan", "inf", "-inf", "1_000", "1__0", " 7 ", "+8", "0x10", "", "."};
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

[[noreturn]] void fail(const std::vector<std::string>& args, const std::string& why) {
    std::fprintf(stderr, "fuzz_flags: %s\n  input:", why.c_str());
    for (const auto& a : args) std::fprintf(stderr, " '%s'", a.c_str());
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
    long rejected = 0, valid = 0, invalid = 0;
    const auto start = std::chrono::steady_clock::now();
    for (long n = 0; n < inputs; ++n) {
        const auto t0 = std::chrono::steady_clock::now();
        std::vector<std::string> args = g.command_line();
        try {
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
    std::printf("fuzz_flags: seed %llu, %ld inputs in %.1f s: %ld valid, %ld invalid (rule violations), %ld rejected (flag_error); "
                "no crash, hang or sanitizer report\n",
                (unsigned long long)seed, inputs, seconds, valid, invalid, rejected);
    std::printf("%ld passed, 0 failed\n", inputs);
    return 0;
}
