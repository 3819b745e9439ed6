// What Megatron's validate_args derives from flags outside the CUDA-graph options before the
// graph rules (flags/validate_args_inputs.hpp), and what it refuses there.
#include <capscope/capscope.hpp>
#include <capscope/flags/from_megatron_flags.hpp>

#include <doctest/doctest.h>

#include <fstream>
#include <regex>
#include <string>
#include <vector>

using namespace capscope;
using namespace capscope::flags;

namespace {
megatron_command_line parse_with_layers(std::vector<std::string> args) {
    args.insert(args.begin(), {"--num-layers", "4"});
    return from_megatron_flags(args);
}
bool refuses(const megatron_command_line& l, std::string_view words) {
    for (const auto& r : l.refused_inputs)
        if (r.message.find(words) != std::string::npos) return true;
    return false;
}
} // namespace

TEST_CASE("dynamic fp16 loss scaling turns the NaN check off, so rule A1 holds under full_iteration") {
    auto dynamic = parse_with_layers({"--fp16", "--cuda-graph-impl", "full_iteration"});
    CHECK_FALSE(dynamic.config.check_for_nan_in_loss_and_grad);
    CHECK(dynamic.derived.params_dtype == "float16");
    CHECK(validate(dynamic.config).valid());

    auto constant = parse_with_layers({"--fp16", "--loss-scale", "1024", "--cuda-graph-impl", "full_iteration"});
    CHECK(constant.config.check_for_nan_in_loss_and_grad);
    const auto report = validate(constant.config);
    REQUIRE_FALSE(report.valid());
    CHECK(report.violations.front().rule->id == "A1");

    CHECK(parse_with_layers({"--fp16", "--loss-scale", "0"}).config.check_for_nan_in_loss_and_grad == false); // 0 is dynamic
    CHECK(parse_with_layers({"--bf16", "--loss-scale", "1024"}).config.check_for_nan_in_loss_and_grad);       // scaling is fp16's
    CHECK(refuses(parse_with_layers({"--fp16", "--bf16"}), "--fp16 and --bf16"));
    CHECK(refuses(parse_with_layers({"--fp32-residual-connection"}), "residual connection in fp32"));
}

TEST_CASE("a hybrid layer pattern replaces --num-layers; pipes set virtual pipelining; / parts are MTP depths") {
    auto l = parse_with_layers({"--hybrid-layer-pattern", "M*-E|M*-E", "--pipeline-model-parallel-size", "1"});
    CHECK(l.config.num_layers == 8);
    CHECK(refuses(l, "When interleaved schedule is used")); // 2 segments on 1 stage: virtual pipelining without PP

    auto pp2 = parse_with_layers({"--hybrid-override-pattern", "M*-E|M*-E|M*|M-", "--pipeline-model-parallel-size", "2"});
    CHECK(pp2.refused_inputs.empty());
    CHECK(pp2.derived.virtual_pipeline_model_parallel_size == 2);
    CHECK(pp2.config.num_layers == 12);

    auto mtp = parse_with_layers({"--hybrid-layer-pattern", "M*-E/M-/M-"});
    CHECK(mtp.derived.mtp_num_layers == 2);
    CHECK(mtp.config.num_layers == 4);
    CHECK(refuses(mtp, "Multi-Token Prediction (MTP) is not supported with learned_absolute"));
    CHECK(parse_with_layers({"--hybrid-layer-pattern", "M*-E/M-", "--position-embedding-type", "rope"}).refused_inputs.empty());

    CHECK(refuses(parse_with_layers({"--hybrid-layer-pattern", "M*X-"}), "'X' is not a valid layer symbol"));
    CHECK(refuses(parse_with_layers({"--hybrid-layer-pattern", "M-", "--hybrid-override-pattern", "M-"}), "cannot both be specified"));
    CHECK(refuses(parse_with_layers({"--hybrid-layer-pattern", ""}), "the model has no layers"));
}

TEST_CASE("pipeline and virtual-pipeline sizes as validate_args derives and checks them") {
    auto vpp = parse_with_layers({"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"});
    CHECK(vpp.refused_inputs.empty());
    CHECK(vpp.derived.virtual_pipeline_model_parallel_size == 2);
    CHECK_FALSE(parse_with_layers({"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "2"})
                    .derived.virtual_pipeline_model_parallel_size); // one virtual stage is none
    CHECK(refuses(parse_with_layers({"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "3"}),
                  "must be divisible number of layers per virtual pipeline stage"));
    CHECK(refuses(parse_with_layers({"--pipeline-model-parallel-size", "2", "--num-layers", "3"}), "Number of layers should be divisible"));
    CHECK(parse_with_layers({"--pipeline-model-parallel-size", "2", "--num-layers", "3", "--decoder-first-pipeline-num-layers", "1"})
              .refused_inputs.empty()); // uneven stages skip the check
    CHECK(refuses(parse_with_layers({"--num-layers-per-virtual-pipeline-stage", "1"}), "When interleaved schedule is used"));
    CHECK(refuses(parse_with_layers({"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1",
                         "--num-virtual-stages-per-pipeline-rank", "2"}),
                  "No more than one of the following arguments"));
    CHECK(refuses(parse_with_layers({"--inference-batch-times-seqlen-threshold", "512"}), "requires setting --pipeline-model-parallel-size > 1"));
    CHECK(refuses(parse_with_layers({"--cpu-offloading-num-layers", "1", "--pipeline-model-parallel-size", "2"}),
                  "no support for Pipeline parallelism with CPU offloading"));
}

TEST_CASE("recompute granularity and method: --recompute-activations wins, then the method must go") {
    CHECK(refuses(parse_with_layers({"--recompute-activations", "--recompute-granularity", "full", "--recompute-method", "uniform"}),
                  "recompute method is not yet supported for selective"));
    CHECK(parse_with_layers({"--recompute-activations", "--recompute-granularity", "full"}).config.recompute == recompute_granularity::selective);
    CHECK(refuses(parse_with_layers({"--recompute-granularity", "full", "--recompute-num-layers", "1"}), "recompute_method must be"));
    CHECK(refuses(parse_with_layers({"--recompute-granularity", "full", "--recompute-method", "block"}), "recompute_num_layers must be between"));
    CHECK(refuses(parse_with_layers({"--recompute-granularity", "selective", "--recompute-num-layers", "1"}), "recompute_num_layers must be None"));
    CHECK(parse_with_layers({"--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "1"}).refused_inputs.empty());
}

TEST_CASE("--moe-layer-freq: argparse's int() for plain values; what building the layers refuses is refused") {
    CHECK_THROWS_WITH_AS(parse_with_layers({"--num-experts", "4", "--moe-layer-freq", "(2)"}), doctest::Contains("invalid moe_freq_type value"), flag_error);
    CHECK_THROWS_AS(parse_with_layers({"--num-experts", "4", "--moe-layer-freq", "1*2"}), flag_error);
    CHECK(parse_with_layers({"--num-experts", "4", "--moe-layer-freq", "02"}).config.moe_layers.frequency() == 2);
    CHECK(refuses(parse_with_layers({"--num-experts", "4", "--moe-layer-freq", "0"}), "not a positive frequency"));
    CHECK(refuses(parse_with_layers({"--num-experts", "4", "--moe-layer-freq", "[]"}), "Invalid length of moe_layer_pattern: 0"));
    CHECK(refuses(parse_with_layers({"--num-experts", "4", "--moe-layer-freq", "[1,1,1]"}), "Invalid length of moe_layer_pattern: 3, expected: 4"));
    CHECK(refuses(parse_with_layers({"--num-experts", "4", "--moe-layer-freq", "[2,1,1,1]"}), "entries other than 0 (dense) and 1 (MoE)"));
    CHECK(parse_with_layers({"--num-experts", "4", "--moe-layer-freq", "[1,0]*2"}).refused_inputs.empty());
    CHECK(parse_with_layers({"--moe-layer-freq", "[1,1,1]"}).refused_inputs.empty()); // dense: the pattern is not read
}

TEST_CASE("every refused input is reported, with the rules beside it") {
    auto l = parse_with_layers({"--fp16", "--bf16", "--recompute-granularity", "full", "--cuda-graph-impl", "local",
                    "--recompute-method", "uniform", "--recompute-num-layers", "1"});
    CHECK(l.refused_inputs.size() == 1);
    CHECK(l.refused_inputs.front().text().find("-- fix: keep one precision flag") != std::string::npos);
    const auto report = validate(l.config);
    REQUIRE_FALSE(report.valid());
    CHECK(report.violations.front().rule->id == "R1");
}

TEST_CASE("generalized tensor parallelism's weight shards, recorded from Megatron's own resolve_tensor_parallel_weight_shards") {
    // tools/conformance/megatron_weight_shards.py ran Megatron-LM d98e8a64dd's function over this
    // grid on the GPU machine (it needs torch): its result (shards, factor) or its ValueError.
    std::ifstream in(CAPSCOPE_UNIT_DATA "/megatron_weight_shards.jsonl");
    REQUIRE(in.good());
    const std::regex line_re(R"re(\{"tp": (\d+), "shards": (null|-?\d+), (?:"resolved": \[(-?\d+), (\d+)\]|"error": "ValueError: ([^"]*)")\})re");
    int cases = 0, refused = 0;
    for (std::string line; std::getline(in, line);) {
        std::smatch m;
        REQUIRE_MESSAGE(std::regex_match(line, m, line_re), line);
        std::vector<std::string> args{"--tensor-model-parallel-size", m[1].str()};
        if (m[2] != "null") args.insert(args.end(), {"--tensor-parallel-num-weight-shards=" + m[2].str()});
        const megatron_command_line l = parse_with_layers(args);
        std::vector<std::string> ours;
        for (const auto& r : l.refused_inputs)
            if (r.message.find("tensor_parallel_num_weight_shards") != std::string::npos) ours.push_back(r.where + ": " + r.message);
        if (m[5].matched) {
            ++refused;
            CHECK_MESSAGE(ours == std::vector<std::string>{"validate_args: " + m[5].str()}, line);
        } else {
            CHECK_MESSAGE(ours.empty(), line);
            CHECK_MESSAGE(l.derived.gtp_weight_remat_size == std::stoi(m[4]), line);
        }
        ++cases;
    }
    MESSAGE(cases << " recorded cases, " << refused << " refused by Megatron");
    CHECK(cases == 115);
}

TEST_CASE("a refused weight-shard count: Megatron's (dense) words, the fix naming the flags given") {
    auto fix_of = [](const megatron_command_line& l) {
        REQUIRE(l.refused_inputs.size() == 1);
        return l.refused_inputs.front().fix;
    };
    CHECK(fix_of(parse_with_layers({"--tensor-model-parallel-size", "2", "--tensor-parallel-num-weight-shards", "3"})) ==
          "give --tensor-parallel-num-weight-shards as a multiple of --tensor-model-parallel-size");
    const auto expert = parse_with_layers({"--expert-tensor-parallel-size", "2", "--expert-tensor-parallel-num-weight-shards", "3"});
    CHECK(expert.refused_inputs.front().message == "tensor_parallel_num_weight_shards (3) must be divisible by tensor_model_parallel_size (2).");
    CHECK(fix_of(expert) == "give --expert-tensor-parallel-num-weight-shards as a multiple of --expert-tensor-parallel-size");
    // Without --expert-tensor-parallel-size the expert size is tp's, and the fix says so.
    CHECK(fix_of(parse_with_layers({"--tensor-model-parallel-size", "2", "--expert-tensor-parallel-num-weight-shards", "1"})) ==
          "give --expert-tensor-parallel-num-weight-shards as a multiple of the expert tensor-parallel size (--tensor-model-parallel-size, as "
          "--expert-tensor-parallel-size is not given), at least that size");
}
