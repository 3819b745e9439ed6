#pragma once
// A bench's command line, each option declared once: what it is called, where its value goes and
// which values it takes. Every bench then refuses an unknown option, a missing value (an option
// where its value should be, too), a missing required option, and a number that is malformed or
// out of range, naming the option and printing its usage, with exit code 2, before it asks for a
// GPU. (std::atoi read "--rounds x" as 0 rounds and "--layers 1O" as 1.)
// Host-only C++ on purpose: tests/unit/test_bench_arguments.cpp runs it without CUDA.

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace bench {

//! What was wrong with a command line, in words that name the option.
struct usage_error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

class arguments {
public:
    explicit arguments(std::string program) : program_(std::move(program)) {}

    //! `name N`: a whole number in [min, max].
    arguments& integer(std::string name, int& target, int min, int max = 1 << 20) {
        const std::string accepted = "an integer from " + std::to_string(min) + " to " + std::to_string(max);
        std::string metavar = metavar_of(name);
        return add(std::move(name), std::move(metavar), [&target, min, max, accepted](const std::string& option, const std::string& text) {
            errno = 0;
            char* end = nullptr;
            const long v = std::strtol(text.c_str(), &end, 10);
            if (text.empty() || *end != '\0' || errno == ERANGE || v < min || v > max)
                throw usage_error(option + " takes " + accepted + ", not '" + text + "'");
            target = int(v);
        });
    }

    //! `name A,B,...`: exactly `count` positive, finite numbers, comma-separated.
    arguments& positive_reals(std::string name, std::vector<double>& target, std::size_t count) {
        const std::string accepted = std::to_string(count) + " positive numbers separated by commas";
        std::string metavar;
        for (std::size_t i = 0; i < count; ++i) metavar += (i ? "," : "") + std::string(1, char('A' + i % 26));
        return add(std::move(name), std::move(metavar), [&target, count, accepted](const std::string& option, const std::string& text) {
            std::vector<double> values;
            std::size_t begin = 0;
            for (;;) {
                const std::size_t comma = text.find(',', begin);
                const std::string item = text.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
                errno = 0;
                char* end = nullptr;
                const double v = std::strtod(item.c_str(), &end);
                if (item.empty() || *end != '\0' || errno == ERANGE || !(v > 0) || !std::isfinite(v))
                    throw usage_error(option + " takes " + accepted + ", not '" + text + "'");
                values.push_back(v);
                if (comma == std::string::npos) break;
                begin = comma + 1;
            }
            if (values.size() != count) throw usage_error(option + " takes " + accepted + ", not '" + text + "'");
            target = std::move(values);
        });
    }

    //! `name VALUE`: any non-empty text (a file or folder name).
    arguments& text(std::string name, std::string& target, std::string metavar = "FILE") {
        return add(std::move(name), std::move(metavar), [&target](const std::string& option, const std::string& value) {
            if (value.empty()) throw usage_error(option + " takes a non-empty value");
            target = value;
        });
    }

    //! `name` alone: sets the flag.
    arguments& flag(std::string name, bool& target) {
        add(std::move(name), "", [&target](const std::string&, const std::string&) { target = true; });
        options_.back().takes_value = false;
        return *this;
    }

    //! The option declared last must be given (its usage shows no brackets).
    arguments& required() {
        if (options_.empty()) throw std::logic_error(program_ + ": required() before any option");
        options_.back().required = true;
        return *this;
    }

    //! Reads argv[1..argc) into the declared targets; throws usage_error at the first thing wrong.
    //! An option given twice takes its last value.
    void parse(int argc, const char* const* argv) const {
        std::vector<bool> given(options_.size());
        for (int i = 1; i < argc; ++i) {
            const std::string name = argv[i];
            const declared* o = find(name);
            if (!o) throw usage_error("unknown option '" + name + "'");
            given[std::size_t(o - options_.data())] = true;
            if (!o->takes_value) {
                o->set(name, "");
                continue;
            }
            // "--csv --markdown x" would otherwise write a file named --markdown.
            if (i + 1 == argc || std::string(argv[i + 1]).rfind("--", 0) == 0)
                throw usage_error(name + " needs a value (" + name + " " + o->metavar + ")");
            o->set(name, argv[++i]);
        }
        for (std::size_t k = 0; k < options_.size(); ++k)
            if (options_[k].required && !given[k]) throw usage_error(options_[k].name + " " + options_[k].metavar + " is required");
    }

    //! parse(), and on a usage error: the program's name, what was wrong and the usage on stderr, exit 2.
    void parse_or_exit(int argc, const char* const* argv) const {
        try {
            parse(argc, argv);
        } catch (const usage_error& e) {
            refuse(e.what());
        }
    }

    //! For what the options say together (a width the kernels do not take, say): the same message
    //! and exit code as a malformed option.
    [[noreturn]] void refuse(const std::string& why) const {
        std::fprintf(stderr, "%s: %s\n%s\n", program_.c_str(), why.c_str(), usage().c_str());
        std::exit(2);
    }

    std::string usage() const {
        std::string u = "usage: " + program_;
        for (const declared& o : options_) {
            const std::string text = o.name + (o.takes_value ? " " + o.metavar : "");
            u += o.required ? " " + text : " [" + text + "]";
        }
        return u;
    }

private:
    struct declared {
        std::string name, metavar;
        bool takes_value = true, required = false;
        std::function<void(const std::string& option, const std::string& value)> set;
    };

    // "--steps-per-round" -> "STEPS_PER_ROUND"
    static std::string metavar_of(const std::string& name) {
        std::string m;
        for (char c : name.substr(name.find_first_not_of('-')))
            m += c == '-' ? '_' : char(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
        return m;
    }

    arguments& add(std::string name, std::string metavar, std::function<void(const std::string&, const std::string&)> set) {
        if (find(name)) throw std::logic_error(program_ + ": option " + name + " declared twice");
        options_.push_back({std::move(name), std::move(metavar), true, false, std::move(set)});
        return *this;
    }

    const declared* find(const std::string& name) const {
        for (const declared& o : options_)
            if (o.name == name) return &o;
        return nullptr;
    }

    std::string program_;
    std::vector<declared> options_;
};

} // namespace bench
