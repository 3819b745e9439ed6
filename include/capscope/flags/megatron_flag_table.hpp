#pragma once
//! @file
//! The Megatron-LM training flags capscope knows, by argparse arity. Flags the rules read are
//! listed too; `from_megatron_flags` gives them meaning, every other known flag is accepted and
//! reported as ignored, and a flag in none of these lists is rejected (Megatron's parser is
//! built with allow_abbrev=False, so prefixes are rejected too).
//!
//! Source: NVIDIA/Megatron-LM `megatron/training/arguments.py` (hand-written groups) and the
//! flags `ArgumentGroupFactory` generates from `TransformerConfig`/`ModelParallelConfig` fields
//! (`--field-name`; bool fields defaulting to True as `--no-field-name`/`--disable-field-name`).
//! Megatron adds flags often: a real flag missing here is a bug in this table; until it is
//! added, `capscope-check --ignore-unknown-flags` (Megatron's `ignore_unknown_args`) goes on.

#include <string_view>

namespace capscope::flags {

enum class arity { none, one, list };

//! Switches (store_true / store_false / BooleanOptionalAction spellings).
inline constexpr std::string_view megatron_switches = R"(
--bf16 --fp16 --fp8-param-gather --fp4-param-gather --first-last-layers-bf16 --keep-fp8-transpose-cache
--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather --overlap-param-gather-with-optimizer-step
--no-align-grad-reduce --no-align-param-gather --sequence-parallel --use-flash-attn --swiglu --squared-relu
--quick-geglu --openai-gelu --untie-embeddings-and-output-weights --disable-bias-linear --add-qkv-bias
--group-query-attention --use-rotary-position-embeddings --no-position-embedding --use-rope-scaling
--no-rope-fusion --no-masked-softmax-fusion --no-bias-gelu-fusion --no-bias-swiglu-fusion --no-bias-dropout-fusion
--no-gradient-accumulation-fusion --no-persist-layer-norm --apply-layernorm-1p --use-mcore-models --use-legacy-models
--no-async-tensor-model-parallel-allreduce --tp-comm-overlap --disable-tp-comm-overlap-ag --disable-tp-comm-overlap-rs
--disable-tp-comm-split-ag --disable-tp-comm-split-rs --disable-tp-comm-bulk-dgrad --disable-tp-comm-bulk-wgrad
--no-load-optim --no-load-rng --no-save-optim --no-save-rng --finetune --use-checkpoint-args --use-dist-ckpt
--auto-detect-ckpt-format --ckpt-fully-parallel-save --no-ckpt-fully-parallel-save --ckpt-fully-parallel-load
--async-save --use-persistent-ckpt-worker --ckpt-assume-constant-structure --no-initialization --exit-on-missing-checkpoint
--log-throughput --log-timers-to-tensorboard --log-validation-ppl-to-tensorboard --log-memory-to-tensorboard
--log-world-size-to-tensorboard --log-params-norm --log-num-zeros-in-grad --log-progress --log-loss-scale-to-tensorboard
--no-log-loss-scale-to-tensorboard --log-batch-size-to-tensorboard --log-learning-rate-to-tensorboard
--no-log-learning-rate-to-tensorboard --log-energy --log-straggler --disable-straggler-on-startup --profile
--use-pytorch-profiler --record-memory-history --check-for-spiky-loss --check-for-large-grads
--distribute-saved-activations --no-clone-scatter-output-in-embedding --manual-gc --manual-gc-eval
--no-manual-gc-eval --moe-grouped-gemm --moe-use-legacy-grouped-gemm --moe-permute-fusion --moe-router-enable-expert-bias
--moe-router-pre-softmax --moe-use-upcycling --moe-layer-recompute --moe-shared-expert-overlap --moe-router-fusion
--moe-apply-probs-on-input --moe-pad-expert-input-to-capacity --moe-router-padding-for-fp8 --moe-per-layer-logging
--moe-enable-deepep --moe-extended-tp --moe-router-force-load-balancing --moe-pad-experts-for-cuda-graph-inference
--overlap-moe-expert-parallel-comm --multi-latent-attention --qk-layernorm --qk-l2-norm --calculate-per-token-loss
--mock-data --no-create-attention-mask-in-dataloader --reset-position-ids --reset-attention-mask --eod-mask-loss
--accumulate-allreduce-grads-in-fp32 --fp16-lm-cross-entropy --attention-softmax-in-fp32 --no-one-logger
--one-logger-async --use-torch-fsdp2 --use-megatron-fsdp --use-fully-shard-api --fsdp-double-buffer --nccl-ub
--fsdp-db-use-persist-buf-on-alloc-fail --megatron-fsdp-max-pool-double-buffer --disable-symmetric-registration
--deterministic-mode --no-check-for-nan-in-loss-and-grad --enable-cuda-graph --external-cuda-graph
--cuda-graph-memory-report --te-rng-tracker --inference-rng-tracker --recompute-activations
--fine-grained-activation-offloading --delay-offload-until-cuda-graph --use-transformer-engine-op-fuser
--perform-rl-step --decrease-batch-size-if-needed --muon-no-split-qkv --muon-use-nesterov --bert-no-binary-head
--run-workload-inspector-server --inprocess-restart --inprocess-empty-cuda-cache --decode-only-cuda-graphs
--enable-chunked-prefill --inference-dynamic-batching-track-generated-token-events --grpo-filter-groups-with-same-reward
--rl-offload-optimizer-during-inference --rl-use-sequence-packing --use-cpu-initialization
--use-precision-aware-optimizer --overlap-p2p-communication-warmup-flush --no-overlap-p2p-communication
--defer-embedding-wgrad-compute --delay-wgrad-compute --use-ring-exchange-p2p --ddp-average-in-collective
--no-gradient-reduce-div-fusion --use-sharp --lazy-mpu-init --account-for-embedding-in-pipeline-split
--account-for-loss-in-pipeline-split --use-tp-pp-dp-mapping --replication --retro-add-retriever
--retro-no-verify-neighbor-count --enable-ft-package --calc-ft-timeouts --sft --disable-msc --exit-signal-handler
--data-parallel-random-init --is-hybrid-model --init-model-with-meta-device   --hybrid-context-parallel
       
--no-mmap-bin-files        
         
--langrl-external-server --no-langrl-external-server --rl-offload-kv-cache-during-training
--no-rl-offload-kv-cache-during-training --rl-remove-kv-cache-during-training --no-rl-remove-kv-cache-during-training
--rl-reset-cuda-graphs --no-rl-reset-cuda-graphs --rl-partial-rollouts --no-rl-partial-rollouts
--rl-inference-logprobs-is-correction --no-rl-inference-logprobs-is-correction --rl-calculate-intra-group-similarity
--no-rl-calculate-intra-group-similarity --inference-wandb-logging --no-inference-wandb-logging
--rl-persist-cuda-graphs --rl-training-cuda-graphs
)";

//! Flags that take exactly one value.
inline constexpr std::string_view megatron_single_value = R"(
--num-layers --hidden-size --ffn-hidden-size --num-attention-heads --num-query-groups --kv-channels --seq-length
--max-position-embeddings --encoder-num-layers --decoder-num-layers --encoder-seq-length --decoder-seq-length
--position-embedding-type --rotary-base --rotary-percent --rotary-seq-len-interpolation-factor --rope-scaling-factor
--rope-type --make-vocab-size-divisible-by --normalization --norm-epsilon --init-method-std --attention-dropout
--hidden-dropout --weight-decay --start-weight-decay --end-weight-decay --weight-decay-incr-style --clip-grad
--adam-beta1 --adam-beta2 --adam-eps --sgd-momentum --micro-batch-size --global-batch-size --batch-size --lr --min-lr
--lr-decay-style --lr-decay-iters --lr-decay-samples --lr-warmup-fraction --lr-warmup-iters --lr-warmup-samples
--lr-warmup-init --lr-wsd-decay-style --lr-wsd-decay-iters --lr-wsd-decay-samples --decoupled-lr --decoupled-min-lr
--train-iters --train-samples --eval-iters --eval-interval --log-interval --save-interval --save --load
--pretrained-checkpoint --seed --data-cache-path --split --tokenizer-type --tokenizer-model --vocab-file --merge-file
--vocab-size --tensor-model-parallel-size --pipeline-model-parallel-size --context-parallel-size
--expert-model-parallel-size --expert-tensor-parallel-size --num-layers-per-virtual-pipeline-stage
--num-virtual-stages-per-pipeline-rank --decoder-first-pipeline-num-layers --decoder-last-pipeline-num-layers
--pipeline-model-parallel-layout --distributed-backend --distributed-timeout-minutes --ckpt-format
--dist-ckpt-strictness --optimizer --loss-scale --initial-loss-scale --min-loss-scale --loss-scale-window --hysteresis
--fp8-format --fp8-recipe --fp8-margin --fp8-interval --fp8-amax-history-len --fp8-amax-compute-algo --fp4-format
--fp4-recipe --attention-backend --num-experts --moe-layer-freq --moe-ffn-hidden-size --moe-router-topk
--moe-z-loss-coeff --moe-input-jitter-eps --moe-token-dispatcher-type --moe-expert-capacity-factor
--moe-token-drop-policy --moe-router-score-function --moe-router-topk-scaling-factor --moe-router-num-groups
--moe-router-group-topk --moe-router-dtype --moe-shared-expert-intermediate-size --moe-router-bias-update-rate
--moe-flex-dispatcher-backend --moe-deepep-num-sms --moe-upcycling-granularity --cuda-graph-impl
--cuda-graph-warmup-steps --inference-cuda-graph-scope --inference-dynamic-batching-num-cuda-graphs
--inference-batch-times-seqlen-threshold --inference-max-seq-length --inference-max-requests
--inference-max-batch-size --inference-dynamic-batching-buffer-size-gb --inference-dynamic-batching-chunk-size
--inference-dynamic-batching-buffer-guaranteed-fraction --inference-dynamic-batching-buffer-overflow-factor
--inference-dynamic-batching-max-requests-override --inference-dynamic-batching-max-tokens-override
--inference-dynamic-batching-unified-memory-level --inference-dynamic-batching-cuda-graph-max-tokens
--inference-dynamic-batching-cuda-graph-mixed-prefill-count --inference-logging-step-interval
--inference-coordinator-port --recompute-granularity --recompute-method --recompute-num-layers
--cpu-offloading-num-layers --min-offloaded-tensor-size --activation-offload-fraction
--delta-offload-bytes-across-pp-ranks --fine-grained-offloading-max-inflight-offloads --transformer-impl
--tensorboard-dir --tensorboard-queue-size --tensorboard-log-interval --wandb-project --wandb-exp-name --wandb-save-dir
--wandb-entity --timing-log-level --timing-log-option --profile-step-start --profile-step-end --exit-interval
--exit-duration-in-mins --num-workers --dataloader-type --data-args-path --per-split-data-args-path
--num-dataset-builder-threads --object-storage-cache-path --mid-level-dataset-surplus --kitchen-config-file
--kitchen-recipe-number --yaml-cfg --hybrid-attention-ratio --hybrid-mlp-ratio --hybrid-override-pattern
--hybrid-layer-pattern --mamba-state-dim --mamba-head-dim --mamba-num-groups --mamba-num-heads
--heterogeneous-layers-config-path --heterogeneous-layers-config-encoded-json --window-size --window-attn-skip-freq
--no-rope-freq --relative-attention-num-buckets --relative-attention-max-distance --qk-head-dim --qk-pos-emb-head-dim
--v-head-dim --q-lora-rank --kv-lora-rank --rotary-scaling-factor --mscale --mscale-all-dim --onnx-safe
--muon-momentum --muon-scale-mode --muon-fp32-matmul-prec --muon-num-ns-steps --muon-tp-mode --muon-extra-scale-factor
--rl-prompts-per-eval --grpo-prompts-per-step --grpo-group-size --grpo-iterations --grpo-clamp-eps-lower
--grpo-clamp-eps-upper --grpo-kl-beta --grpo-entropy-term-weight --grpo-default-temperature --grpo-default-top-p
--langrl-inference-server-type --langrl-inference-server-conversation-template --langrl-env-config
--rl-importance-sampling-truncation-coef --rl-sequence-packing-bin-size --rl-sequence-packing-algo
--inprocess-max-iterations --inprocess-monitor-thread-interval --inprocess-monitor-process-interval
--inprocess-progress-watchdog-interval --inprocess-heartbeat-interval --inprocess-soft-timeout --inprocess-hard-timeout
--inprocess-heartbeat-timeout --inprocess-barrier-timeout --inprocess-completion-timeout --inprocess-last-call-wait
--inprocess-termination-grace-time --inprocess-granularity --inprocess-active-world-size --one-logger-project
--one-logger-run-name --non-persistent-save-interval --non-persistent-ckpt-type --non-persistent-global-ckpt-dir
--non-persistent-local-ckpt-dir --non-persistent-local-ckpt-algo --ckpt-step --ckpt-convert-format --ckpt-convert-save
--tp-comm-overlap-cfg --tp-comm-bootstrap-backend --ddp-bucket-size --ddp-num-buckets --data-parallel-sharding-strategy
--num-distributed-optimizer-instances --local-rank --microbatch-group-size-per-virtual-pipeline-stage
--replication-jump --replication-factor --num-channels --patch-dim --img-h --img-w --classes-fraction
--data-per-class-fraction --head-lr-mult --retro-project-dir --retro-cyclic-train-iters --retro-encoder-layers
--retro-encoder-hidden-dropout --retro-encoder-attention-dropout --retro-num-neighbors --retro-num-retrieved-chunks
--retro-attention-gate --config-logger-dir --rerun-mode --error-injection-rate --error-injection-type
--result-rejected-tracker-filename --straggler-ctrlr-port --straggler-minmax-count --mtp-num-layers
--mtp-loss-scaling-factor --sft-tokenizer-prompt-format --empty-unused-memory-level
--check-weight-hash-across-dp-replicas-interval --suggested-communication-unit-size --sharp-enabled-group
--te-precision-config-file --manual-gc-interval  
  --tokenizer-hf-use-fast --tokenizer-prompt-format --tiktoken-pattern --tiktoken-num-special-tokens
  --logging-level --memory-snapshot-path    
       
--gtp-weight-remat-size   --vision-cuda-graph-impl --max-vision-cuda-graph-seq-length
)";

//! Flags that take a list (argparse nargs '+' or '*').
inline constexpr std::string_view megatron_lists = R"(
--data-path --train-data-path --valid-data-path --test-data-path --spec --rampup-batch-size --iterations-to-skip
--cuda-graph-modules --cuda-graph-scope --recompute-modules --offload-modules --moe-router-load-balancing-type
--moe-aux-loss-coeff --cp-comm-type --hierarchical-context-parallel-sizes --profile-ranks --tiktoken-special-tokens
--special-tokens --retro-neighbor-dirs   --vision-cuda-graph-scope  
)";

//! Flags Megatron-LM removed, with what replaces them (Megatron rejects them as unknown).
struct removed_flag {
    std::string_view name;
    std::string_view replacement;
};
inline constexpr removed_flag megatron_removed_flags[] = {
    {"--inference-use-full-iteration-cuda-graph",
     "--cuda-graph-impl local --inference-cuda-graph-scope block"},
    {"--cuda-graph-use-single-mempool", "nothing: it is a TransformerConfig field with no command-line flag"},
    {"--cuda-graph-retain-backward-graph", "nothing: it is a TransformerConfig field with no command-line flag"},
};

} // namespace capscope::flags
