#pragma once
//! @file
//! A Megatron-LM command line as read: the configuration the rules check, the flags given
//! (by dest, last occurrence winning), and the values validate_args derives before the rules.

#include <capscope/pipeline/replay_check.hpp>
#include <capscope/pipeline/schedule_shape.hpp>
#include <capscope/vocabulary/runtime_config.hpp>

#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace capscope::flags {

//! The command line is not one Megatron's parser accepts (argparse would exit 2).
class flag_error : public std::invalid_argument {
    using std::invalid_argument::invalid_argument;
};

struct parse_options {
    bool ignore_unknown = false; //!< Megatron's `ignore_unknown_args`: report unknown flags instead of failing
    //! Megatron's WORLD_SIZE (no flag): with it the microbatch count, and so the pipeline
    //! schedule, is known (pipeline_schedule_inputs.hpp).
    std::optional<int> world_size = std::nullopt;
};

//! One global batch size the run takes, and its schedule's verdict.
struct pipeline_batch {
    long long global_batch = 0;
    int microbatches = 0;
    pipeline::schedule_rule rule = pipeline::schedule_rule::none;
    pipeline::communicator_plan communicators{}; //!< when the rules hold
};

struct pipeline_schedule_inputs {
    bool shown = false;                          //!< --pipeline-model-parallel-size above 1
    std::optional<pipeline::schedule_shape> shape; //!< none when --pipeline-model-parallel-layout gives the split
    int group_given = 0;                         //!< --microbatch-group-size-per-virtual-pipeline-stage as given (0: absent, the default; -1: below 1 or past 2^20)
    bool overlap_p2p = false;                    //!< Megatron overlaps sends and receives with compute (interleaved's default)
    int data_parallel = 0;                       //!< the calculator's: world / (tp x pp x cp); 0 when not known
    int replicas = 0;                            //!< data-parallel replicas: world / (tp x pp x cp x weight-shard factor)
    int micro_batch = 0;
    int eval_microbatches = 0;                   //!< evaluate()'s count; 0 when not known
    std::vector<pipeline_batch> batches;         //!< the batch sizes the run takes, in order; empty when not known
    std::string not_known;                       //!< why the microbatch count is not known
};


struct megatron_command_line {
    runtime_config config;
    //! What validate_args derives from flags outside the CUDA-graph options before the rules
    //! run (validate_args_inputs.hpp): they are shown, and some of them feed `config`.
    struct derived_inputs {
        std::string params_dtype = "float32";  //!< --fp16, --bf16
        int pipeline_model_parallel_size = 1;
        std::optional<int> virtual_pipeline_model_parallel_size;  //!< none when 1
        int mtp_num_layers = 0;                 //!< from the hybrid pattern's / depths
        int gtp_weight_remat_size = 1;          //!< --tensor-parallel-num-weight-shards / tp: a model-size factor
    } derived;
    //! An input Megatron refuses before the CUDA-graph rules (validate_args_inputs.hpp): the
    //! configuration is invalid (exit 1), and the rules are still checked and reported.
    struct refused_input {
        std::string where;   //!< "validate_args", "TransformerConfig", ...
        std::string message; //!< Megatron's words
        std::string fix;
        std::string text() const { return "Megatron's " + where + " refuses: " + message + " -- fix: " + fix; }
    };
    std::vector<refused_input> refused_inputs; //!< in Megatron's order
    pipeline_schedule_inputs pipeline;         //!< the pipeline schedule the line runs (pipeline_schedule_inputs.hpp)
    std::vector<std::string> read;     //!< flags the rules read
    std::vector<std::string> ignored;  //!< known Megatron flags no rule reads
    std::vector<std::string> unknown;  //!< with ignore_unknown: flags Megatron does not have

    //! The last occurrence of a known flag: its spelling and values (checked against its type).
    struct given_flag {
        std::string flag;
        std::vector<std::string> values;
    };
    //! Every known flag given, by dest (argparse's name), last occurrence winning.
    std::vector<std::pair<std::string, given_flag>> given;
    //! The flag given for `dest`, or nullptr.
    const given_flag* find(std::string_view dest) const {
        for (const auto& [d, g] : given)
            if (d == dest) return &g;
        return nullptr;
    }
};

} // namespace capscope::flags
