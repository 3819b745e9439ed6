// Megatron command lines -> runtime_config, with argparse's behaviour.
#include <capscope/capscope.hpp>
#include <capscope/flags/from_megatron_flags.hpp>

#include <doctest/doctest.h>

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
    CHECK(l.ignored == std::vector<std::string>{"--bf16", "--lr"});
}

TEST_CASE("usage errors match argparse's") {
    CHECK_THROWS_WITH_AS(parse({"--cuda-graph-imp", "local"}), doctest::Contains("unrecognized arguments: --cuda-graph-imp"), flag_error);
    CHECK_THROWS_WITH_AS(parse({"--cuda-graph-impl", "lokal"}), doctest::Contains("invalid choice: 'lokal'"), flag_error);
    CHECK_THROWS_WITH_AS(parse({"--num-experts", "eight"}), doctest::Contains("invalid int value: 'eight'"), flag_error);
    CHECK_THROWS_WITH_AS(parse({"--num-experts"}), doctest::Contains("expected one argument"), flag_error);
    CHECK_THROWS_WITH_AS(parse({"--bf16=1"}), doctest::Contains("ignored explicit argument"), flag_error);
    CHECK_THROWS_WITH_AS(parse({"model.yaml"}), doctest::Contains("unrecognized arguments: model.yaml"), flag_error);
    CHECK_THROWS_WITH_AS(parse({"--inference-use-full-iteration-cuda-graph"}), doctest::Contains("removed from Megatron-LM"), flag_error);
    CHECK_THROWS_WITH_AS(parse({"--recompute-modules", "everything"}), doctest::Contains("invalid choice"), flag_error);
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

TEST_CASE("FSDP version from --use-megatron-fsdp and --use-fully-shard-api") {
    CHECK(parse({"--use-megatron-fsdp"}).config.fsdp.mode == fsdp_mode::v1);
    CHECK(parse({"--use-fully-shard-api", "--use-megatron-fsdp"}).config.fsdp.mode == fsdp_mode::v2);
    CHECK(parse({"--use-fully-shard-api"}).config.fsdp.mode == fsdp_mode::off);
}

TEST_CASE("the flag table lists each flag once") {
    std::multiset<std::string> seen;
    for (auto list : {megatron_switches, megatron_single_value, megatron_lists}) {
        std::size_t i = 0;
        while (i < list.size()) {
            while (i < list.size() && std::isspace(static_cast<unsigned char>(list[i]))) ++i;
            std::size_t j = i;
            while (j < list.size() && !std::isspace(static_cast<unsigned char>(list[j]))) ++j;
            if (j > i) seen.insert(std::string(list.substr(i, j - i)));
            i = j;
        }
    }
    for (const auto& f : seen) CHECK_MESSAGE(seen.count(f) == 1, f, " is listed twice");
}
