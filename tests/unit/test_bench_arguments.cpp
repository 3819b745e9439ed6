// The benches' command line (bench/arguments.hpp): values land where declared, and everything
// else is refused with a message that names the option and what it takes.

#include "arguments.hpp"

#include <doctest/doctest.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct bench_options {
    int rounds = 10, layers = 24;
    std::vector<double> factors{1.5, 4.0};
    std::string csv;
    bool mixed = false;
};

bench::arguments declare(bench_options& o) {
    return bench::arguments("demo")
        .integer("--rounds", o.rounds, 1)
        .integer("--layers", o.layers, 2, 96)
        .positive_reals("--factors", o.factors, 2)
        .text("--csv", o.csv)
        .flag("--mixed", o.mixed);
}

//! The message of the usage error that parsing `args` throws, or "" when it parses.
std::string refusal(std::vector<const char*> args) {
    bench_options o;
    args.insert(args.begin(), "demo");
    try {
        declare(o).parse(int(args.size()), args.data());
    } catch (const bench::usage_error& e) {
        return e.what();
    }
    return "";
}

} // namespace

TEST_CASE("bench arguments: values land where declared, defaults stay otherwise") {
    bench_options o;
    const char* argv[] = {"demo", "--layers", "12", "--csv", "out.csv", "--mixed", "--factors", "1.25,3", "--rounds", "7", "--rounds", "8"};
    declare(o).parse(12, argv);
    CHECK(o.layers == 12);
    CHECK(o.rounds == 8); // the last of two
    CHECK(o.csv == "out.csv");
    CHECK(o.mixed);
    CHECK(o.factors == std::vector<double>{1.25, 3.0});

    bench_options d;
    const char* none[] = {"demo"};
    declare(d).parse(1, none);
    CHECK(d.rounds == 10);
    CHECK(d.layers == 24);
    CHECK_FALSE(d.mixed);
}

TEST_CASE("bench arguments: unknown options, missing and malformed values are refused, naming the option") {
    CHECK(refusal({"--round", "3"}) == "unknown option '--round'");
    CHECK(refusal({"--rounds"}) == "--rounds needs a value (--rounds ROUNDS)");
    CHECK(refusal({"--layers", "12", "--csv"}) == "--csv needs a value (--csv FILE)");
    // std::atoi read each of these as a number (0, 1, 12, 0).
    CHECK(refusal({"--rounds", "x"}) == "--rounds takes an integer from 1 to 1048576, not 'x'");
    CHECK(refusal({"--layers", "1O"}) == "--layers takes an integer from 2 to 96, not '1O'");
    CHECK(refusal({"--layers", "12.5"}) == "--layers takes an integer from 2 to 96, not '12.5'");
    CHECK(refusal({"--rounds", ""}) == "--rounds takes an integer from 1 to 1048576, not ''");
    CHECK(refusal({"--rounds", "99999999999999999999"}) == "--rounds takes an integer from 1 to 1048576, not '99999999999999999999'");
    CHECK(refusal({"--csv", ""}) == "--csv takes a non-empty value");
    // An option where the value should be: "--csv --mixed" would write a file named --mixed.
    CHECK(refusal({"--csv", "--mixed"}) == "--csv needs a value (--csv FILE)");
    CHECK(refusal({"--rounds", "--layers", "4"}) == "--rounds needs a value (--rounds ROUNDS)");
}

TEST_CASE("bench arguments: a required option must be given, and its usage shows no brackets") {
    std::string out;
    int rounds = 1;
    const bench::arguments args = bench::arguments("demo").integer("--rounds", rounds, 1).text("--out", out, "DIR").required();
    CHECK(args.usage() == "usage: demo [--rounds ROUNDS] --out DIR");
    const char* without[] = {"demo", "--rounds", "3"};
    CHECK_THROWS_WITH_AS(args.parse(3, without), "--out DIR is required", bench::usage_error);
    const char* with[] = {"demo", "--out", "runs"};
    args.parse(3, with);
    CHECK(out == "runs");
}

TEST_CASE("bench arguments: an option declared twice is the bench's own mistake") {
    bool a = false, b = false;
    CHECK_THROWS_AS(bench::arguments("demo").flag("--mixed", a).flag("--mixed", b), std::logic_error);
}

TEST_CASE("bench arguments: numbers outside their range are refused with the range") {
    CHECK(refusal({"--rounds", "0"}) == "--rounds takes an integer from 1 to 1048576, not '0'");
    CHECK(refusal({"--rounds", "-3"}) == "--rounds takes an integer from 1 to 1048576, not '-3'");
    CHECK(refusal({"--layers", "1"}) == "--layers takes an integer from 2 to 96, not '1'");
    CHECK(refusal({"--layers", "97"}) == "--layers takes an integer from 2 to 96, not '97'");
    CHECK(refusal({"--layers", "96"}).empty());
}

TEST_CASE("bench arguments: a list of reals needs its count, each positive and finite") {
    CHECK(refusal({"--factors", "1.5,4"}).empty());
    for (const char* bad : {"1.5", "1.5,4,8", "1.5,", ",4", "1.5,x", "0,4", "-1,4", "1.5,inf", "nan,4"}) {
        CAPTURE(bad);
        CHECK(refusal({"--factors", bad}) == std::string("--factors takes 2 positive numbers separated by commas, not '") + bad + "'");
    }
}

TEST_CASE("bench arguments: the usage lists every option in declaration order") {
    bench_options o;
    CHECK(declare(o).usage() == "usage: demo [--rounds ROUNDS] [--layers LAYERS] [--factors A,B] [--csv FILE] [--mixed]");
}

TEST_CASE("bench arguments: a refused value leaves its target as it was") {
    bench_options o;
    const char* argv[] = {"demo", "--layers", "5x"};
    CHECK_THROWS_AS(declare(o).parse(3, argv), bench::usage_error);
    CHECK(o.layers == 24);
    const char* lists[] = {"demo", "--factors", "2,0"};
    CHECK_THROWS_AS(declare(o).parse(3, lists), bench::usage_error);
    CHECK(o.factors == std::vector<double>{1.5, 4.0});
}
