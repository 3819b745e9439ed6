// Megatron command lines -> runtime_config, with argparse's behaviour.
#include <capscope/capscope.hpp>
#include <capscope/flags/argument_file.hpp>
#include <capscope/flags/from_megatron_flags.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

using namespace capscope;
using namespace capscope::flags;

namespace {
megatron_command_line parse(std::vector<std::string> args, parse_options o = {}) { return from_megatron_flags(args, o); }
} // namespace

TEST_CASE("rule flags are read; other Megatron flags are ignored but accepted") {
    auto l = parse({"--num-layers", "24", "--bf16", "--cuda-graph-impl", "transformer_engine", "--cuda-graph-modules", "attn",
                    "mlp", "--lr=3e-4", "--inference-batch-times-seqlen-threshold", "-1", "--attention-dropout", "0"});
    CHECK(l.config.impl == graph_impl::ahead_of_time_per_layer);
    CHECK(l.config.modules.modules == capture_module_set{capture_module::attention, capture_module::mlp});
    CHECK(l.config.num_layers == 24);
    CHECK(l.config.inference_batch_times_seqlen_threshold == -1);
    CHECK(l.config.attention_dropout == 0.0);
    CHECK(l.ignored == std::vector<std::string>{"--lr"});
    CHECK(std::find(l.read.begin(), l.read.end(), "--bf16") != l.read.end()); // validate_args reads it (precision)
}

TEST_CASE("usage errors match argparse's") {
    CHECK_THROWS_WITH_AS(parse({"--cuda-graph-imp", "local"}), doctest::Contains("unrecognized arguments: --cuda-graph-imp"), flag_error);
    CHECK_THROWS_WITH_AS(parse({"--cuda-graph-impl", "lokal"}), doctest::Contains("invalid choice: 'lokal'"), flag_error);
    CHECK_THROWS_WITH_AS(parse({"--num-experts", "eight"}), doctest::Contains("invalid int value: 'eight'"), flag_error);
    CHECK_THROWS_WITH_AS(parse({"--num-experts"}), doctest::Contains("expected one argument"), flag_error);
    CHECK_THROWS_WITH_AS(parse({"--bf16=1"}), doctest::Contains("ignored explicit argument"), flag_error);
    CHECK_THROWS_WITH_AS(parse({"model.yaml"}), doctest::Contains("unrecognized arguments: model.yaml"), flag_error);
    CHECK_THROWS_WITH_AS(parse({"--inference-use-full-iteration-cuda-graph"}), doctest::Contains("removed from Megatron-LM"), flag_error);
    // Megatron's parser takes any recompute module name; its TransformerConfig rejects unknown ones (rule R0).
    const auto unknown_module = parse({"--recompute-activations", "--recompute-modules", "everything"});
    CHECK(unknown_module.config.unknown_recompute_module.view() == "everything");
    CHECK(validate(unknown_module.config).violations.at(0).rule->id == "R0");
    CHECK_THROWS_WITH_AS(parse({"--moe-layer-freq", "[1]*3+2"}), doctest::Contains("cannot add a list and a number"), flag_error);
}

TEST_CASE("ignore_unknown skips unknown flags and their values") {
    auto l = parse({"--my-trainer-flag", "7", "--cuda-graph-impl", "local"}, {.ignore_unknown = true});
    CHECK(l.unknown == std::vector<std::string>{"--my-trainer-flag"});
    CHECK(l.config.impl == graph_impl::lazy_per_layer);
}

TEST_CASE("last occurrence wins; --recompute-activations means selective") {
    auto l = parse({"--num-experts", "4", "--num-experts", "8", "--recompute-activations"});
    CHECK(l.config.num_experts == 8);
    CHECK(l.config.recompute == recompute_granularity::selective);
}

TEST_CASE("moe layer patterns evaluate like Megatron's Python expressions") {
    auto p = parse_moe_layer_freq("([0]+[1]*3)*2");
    REQUIRE(p.is_pattern());
    CHECK(p.pattern_length() == 8);
    CHECK_FALSE(p.pattern_moe(0));
    CHECK(p.pattern_moe(1));
    CHECK(p.has_dense_layer(8));
    CHECK(parse_moe_layer_freq("[1,1,1]").has_dense_layer(3) == false);
    CHECK(parse_moe_layer_freq("4").frequency() == 4);
    CHECK_THROWS(parse_moe_layer_freq("__import__('os')"));
    CHECK_THROWS(parse_moe_layer_freq("[2]*4"));
}

TEST_CASE("FSDP version from --use-megatron-fsdp and --megatron-fsdp-version") {
    CHECK(parse({"--use-megatron-fsdp"}).config.fsdp.mode == fsdp_mode::v1);
    CHECK(parse({"--megatron-fsdp-version", "2", "--use-megatron-fsdp"}).config.fsdp.mode == fsdp_mode::v2);
    CHECK(parse({"--megatron-fsdp-version", "2"}).config.fsdp.mode == fsdp_mode::off);
    CHECK_THROWS_WITH_AS(parse({"--megatron-fsdp-version", "3"}), "argument --megatron-fsdp-version: invalid choice: 3 (choose from 1, 2)",
                         flag_error);
    // Spellings an earlier capscope accepted, which Megatron's parser never had.
    CHECK_THROWS_WITH_AS(parse({"--use-fully-shard-api"}),
                         "unrecognized arguments: --use-fully-shard-api (never a Megatron-LM flag; use "
                         "--megatron-fsdp-version 2 (Megatron-FSDP v2, with --use-megatron-fsdp))",
                         flag_error);
    CHECK(parse({"--use-nccl-ub"}).config.fsdp.nccl_user_buffers);
}

TEST_CASE("the generated flag table is sorted, unique, and records Megatron's commit") {
    CHECK(megatron_commit == "d98e8a64dd");
    CHECK(megatron_option_strings == 878);
    for (std::size_t i = 1; i < std::size(megatron_flag_table); ++i)
        CHECK_MESSAGE(megatron_flag_table[i - 1].flag < megatron_flag_table[i].flag, megatron_flag_table[i].flag);
    std::size_t extensions = 0;
    for (const auto& f : megatron_flag_table) extensions += f.extension ? 1 : 0;
    CHECK(std::size(megatron_flag_table) == megatron_option_strings + extensions);
}

TEST_CASE("values as argparse reads them: nargs, types, choices, and the last spelling of a dest wins") {
    // nargs
    CHECK_THROWS_WITH_AS(parse({"--num-layers"}), "argument --num-layers: expected one argument", flag_error);
    CHECK_THROWS_WITH_AS(parse({"--cuda-graph-modules"}), "argument --cuda-graph-modules: expected at least one argument", flag_error);
    CHECK_THROWS_WITH_AS(parse({"--bf16=1"}), "argument --bf16: ignored explicit argument '1'", flag_error);
    CHECK_NOTHROW(parse({"--train-data-path"}));                                            // nargs '*'
    CHECK_NOTHROW(parse({"--spec", "a", "b", "c", "--num-layers", "2"}));                   // nargs '*' stops at the next option
    CHECK_THROWS_WITH_AS(parse({"--rope-scaling-factor", "x"}), "argument --rope-scaling-factor: invalid float value: 'x'", flag_error);
    // Python's int() and float()
    CHECK(parse({"--num-layers", "1_000"}).config.num_layers == 1000);
    CHECK(parse({"--num-layers", " +24 "}).config.num_layers == 24);
    CHECK_THROWS_WITH_AS(parse({"--num-layers", "2.0"}), "argument --num-layers: invalid int value: '2.0'", flag_error);
    CHECK_THROWS_WITH_AS(parse({"--num-layers", "1__0"}), "argument --num-layers: invalid int value: '1__0'", flag_error);
    CHECK(parse({"--attention-dropout", "1e-1"}).config.attention_dropout == 0.1);
    CHECK(parse({"--attention-dropout", "-.5"}).config.attention_dropout == -0.5);
    CHECK_THROWS_WITH_AS(parse({"--attention-dropout", "0.1.2"}), "argument --attention-dropout: invalid float value: '0.1.2'", flag_error);
    // choices, on every flag that has them, not only the ones the rules read
    CHECK_THROWS_WITH_AS(parse({"--ckpt-format", "zip"}),
                         "argument --ckpt-format: invalid choice: 'zip' (choose from 'torch', 'torch_dist', 'torch_dcp', 'fsdp_dtensor')",
                         flag_error);
    // two spellings, one dest: the last one wins
    const auto a = parse({"--rl-persist-cuda-graphs", "--no-rl-persist-cuda-graphs"});
    CHECK(a.ignored == std::vector<std::string>{"--rl-persist-cuda-graphs", "--no-rl-persist-cuda-graphs"});
    CHECK(parse({"--cuda-graph-impl", "local", "--cuda-graph-impl=full_iteration"}).config.impl == graph_impl::whole_iteration);
}

TEST_CASE("argument files are split like a POSIX shell, and nest") {
    auto where = [](int line) { return "args.txt:" + std::to_string(line); };
    using capscope::flags::detail::shell_words;
    CHECK(shell_words("--a 1 --b   2\n--c\t'x y' \"p \\\"q\\\"\" r\\ s # comment\n--d", where) ==
          std::vector<std::string>{"--a", "1", "--b", "2", "--c", "x y", "p \"q\"", "r s", "--d"});
    CHECK(shell_words("--a \\\n  1 ''", where) == std::vector<std::string>{"--a", "1", ""});
    CHECK(shell_words("x#not-a-comment", where) == std::vector<std::string>{"x#not-a-comment"});
    CHECK_THROWS_WITH_AS(shell_words("--a\n'b\n\n", where), "args.txt:2: unterminated single quote", flag_error);
    CHECK_THROWS_WITH_AS(expand_argument_files({"@/nonexistent/capscope/args.txt"}), "cannot read argument file /nonexistent/capscope/args.txt",
                         flag_error);
    CHECK(expand_argument_files({"--num-layers", "2"}) == std::vector<std::string>{"--num-layers", "2"});
}
